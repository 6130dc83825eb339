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

  // The probe latency histogram (stallwatch_probe_duration_seconds) in the dashboards,
  // as classic buckets (`_bucket`, summed by `le`) or, with `native`, as one native
  // histogram series (_config.nativeHistograms). `sel` is the inside of the selector's
  // braces, `by` the labels kept besides `le`.
  probeQuantile(native, q, by, sel, window)::
    if native then
      'histogram_quantile(%g, sum by (%s) (rate(stallwatch_probe_duration_seconds{%s}[%s])))' % [q, by, sel, window]
    else
      'histogram_quantile(%g, sum by (%s, le) (rate(stallwatch_probe_duration_seconds_bucket{%s}[%s])))' % [q, by, sel, window],

  // A heatmap's query over the probe histogram: per bucket (`le`), or the native histogram.
  probeHeatmap(native, fn, sel, window)::
    if native then
      'sum(%s(stallwatch_probe_duration_seconds{%s}[%s]))' % [fn, sel, window]
    else
      'sum by (le) (%s(stallwatch_probe_duration_seconds_bucket{%s}[%s]))' % [fn, sel, window],

  // The probe histogram's series, for label_values() of the dashboards' variables.
  probeSeries(native):: if native then 'stallwatch_probe_duration_seconds' else 'stallwatch_probe_duration_seconds_bucket',
}
