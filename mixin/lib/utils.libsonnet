// Small helpers shared by the alerts, rules and dashboards.
{
  // `{a, b}` from the non-empty matchers, or '' when there is none, so a default
  // (empty) stallwatchSelector leaves a query exactly as written by hand.
  selector(matchers)::
    local parts = std.filter(function(m) m != '', matchers);
    if std.length(parts) == 0 then '' else '{' + std.join(',', parts) + '}',

  // A YAML `>-` folded block: the lines of a ||| text block joined by single spaces.
  fold(text)::
    std.join(' ', std.filter(function(l) l != '', std.split(text, '\n'))),

  // 0.5 -> "500ms", 30 -> "30s": how the alert texts name a threshold.
  humanSeconds(s)::
    if s < 1 then '%dms' % std.floor(s * 1000 + 0.5) else '%gs' % s,

  // 0.8 -> "80%".
  percent(f):: '%d%%' % std.floor(f * 100 + 0.5),

  // '10m' -> "10 minutes", '1h' -> "1 hour": a Prometheus duration in an alert's text.
  durationWords(d)::
    local n = std.parseInt(std.substr(d, 0, std.length(d) - 1));
    local unit = { s: 'second', m: 'minute', h: 'hour', d: 'day' }[d[std.length(d) - 1]];
    '%d %s%s' % [n, unit, if n == 1 then '' else 's'],

  // The probe latency histogram (stallwatch_probe_duration_seconds) in the dashboards.
  // Default (`native` false): the classic buckets (`_bucket`, summed by `le`) or, where an
  // engine has none (a Prometheus 2.42 scraping protobuf with native histograms keeps only
  // the native histogram), the native histogram: `classic or native`, as the latency
  // alerts and the quantile recording rules do. Both sides carry the labels `by`, so `or`
  // keeps the classic result wherever there is one. With `native`
  // (_config.nativeHistograms): the native histogram only. `sel` is the inside of the
  // selector's braces, `by` the labels kept besides `le`.
  probeQuantile(native, q, by, sel, window)::
    local nat = 'histogram_quantile(%g, sum by (%s) (rate(stallwatch_probe_duration_seconds{%s}[%s])))' % [q, by, sel, window];
    if native then nat
    else 'histogram_quantile(%g, sum by (%s, le) (rate(stallwatch_probe_duration_seconds_bucket{%s}[%s]))) or %s' % [q, by, sel, window, nat],

  // A heatmap's query over the probe histogram: per bucket (`le`), or the native histogram.
  // The one place the switch still matters in the default build: Grafana's heatmap
  // (`format: heatmap`) turns `le` series into cells, a native histogram is another data
  // shape, so one query cannot serve both (docs/fleet.md).
  probeHeatmap(native, fn, sel, window)::
    if native then
      'sum(%s(stallwatch_probe_duration_seconds{%s}[%s]))' % [fn, sel, window]
    else
      'sum by (le) (%s(stallwatch_probe_duration_seconds_bucket{%s}[%s]))' % [fn, sel, window],

  // The probe histogram's series with the matchers `sel`, for label_values() of the
  // dashboards' variables: the native histogram's, or by default the classic buckets' or
  // the native histogram's, whichever the engine has.
  probeSeries(native, sel)::
    if native then 'stallwatch_probe_duration_seconds{%s}' % sel
    else '{__name__=~"stallwatch_probe_duration_seconds_bucket|stallwatch_probe_duration_seconds",%s}' % sel,
}
