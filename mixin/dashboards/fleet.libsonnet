// The fleet dashboard: grafana/stallwatch-fleet.json. Reads the recording rules
// (rules/rules.libsonnet) and the host and target info metrics; one panel is one entry
// of `panels`.
local g = import '../lib/grafana.libsonnet';
local u = import '../lib/utils.libsonnet';

{
  grafanaDashboards+:: {
    'stallwatch-fleet.json':
      local c = $._config;
      local f = { job: 'job=~"$job"', n: c.fleetTopN, w: c.recordingWindow };
      // With nativeHistograms, the latency panels read the native histogram itself over
      // the recording rules' window; the bucket recording rules need the classic buckets.
      // By default they read the recording rules, which work on every engine (the p99
      // rule falls back to the native histogram), the bucket rule or, where an engine has
      // no buckets, the p99 rule; only the heatmap needs the classic buckets.
      local native = c.nativeHistograms;
      local fsyncSel = '%(job)s,op=~"fsync|fdatasync"' % f;
      // Click a host in a top list: the per-host dashboard for it.
      local hostLink = {
        fieldConfig+: { defaults+: { links: [{
          title: 'stallwatch: ${__field.labels.instance}',
          url: '/d/%s/?var-datasource=${datasource}&var-instance=${__field.labels.instance}&${__url_time_range}' % c.hostDashboardUid,
        }] } },
      };
      {
        __requires: [
          { type: 'grafana', id: 'grafana', name: 'Grafana', version: '10.0.0' },
          { type: 'datasource', id: 'prometheus', name: 'Prometheus', version: '1.0.0' },
        ] + [
          { type: 'panel', id: p, name: p, version: '' }
          for p in ['stat', 'table', 'bargauge', 'timeseries', 'heatmap']
        ],
        id: null,
        uid: c.fleetDashboardUid,
        title: 'stallwatch: fleet',
        description: 'Storage stalls across every host running stallwatch: the hosts that stall most, latency by kernel release and filesystem type, the fleet latency distribution, calls blocked right now. Built on the stallwatch recording rules.',
        tags: c.dashboardTags + ['fleet'],
        editable: true,
        graphTooltip: 1,
        time: { from: 'now-24h', to: 'now' },
        refresh: '1m',
        timezone: '',
        schemaVersion: 39,
        version: 1,
        links: [{
          title: 'Per host',
          type: 'dashboards',
          tags: ['stallwatch'],
          asDropdown: true,
          includeVars: false,
          keepTime: true,
        }],
        annotations: { list: [] },
        templating: { list: [
          g.datasourceVariable('The Prometheus that scrapes stallwatch and evaluates its recording rules.'),
          g.queryVariable('job', 'Job', 'Scrape jobs with stallwatch agents.', 'stallwatch_build_info, job'),
          g.queryVariable('op',
                          'Op',
                          'Timed system call shown in the fleet latency heatmap.',
                          if native then 'stallwatch_probe_duration_seconds{%(job)s}, op' % f
                          else 'instance_target_mode_op:stallwatch_probe_duration_seconds:p99_%(w)s{%(job)s}, op' % f,
                          current='fsync'),
        ] },
        panels: [
          g.row(1, 'Fleet now', 0),
          g.stat(2,
                 'Hosts reporting',
                 'Agents Prometheus scrapes in the selected jobs (count of stallwatch_build_info). A host missing here has no alert either: see StallwatchAbsent.',
                 'none',
                 { h: 4, w: 6, x: 0, y: 1 },
                 [g.target('count(stallwatch_build_info{%(job)s})' % f, instant=true)]),
          g.stat(3,
                 'Hosts with a call blocked now',
                 'Hosts where at least one probe has been inside one system call for longer than %gs right now (instance_target:stallwatch_probe_blocked_calls:sum). Applications on that filesystem are most likely blocked too.' % c.blockedCallSeconds,
                 'none',
                 { h: 4, w: 6, x: 6, y: 1 },
                 [g.target('count(sum by (instance) (instance_target:stallwatch_probe_blocked_calls:sum{%(job)s}) > 0) or vector(0)' % f, instant=true)])
          + { fieldConfig+: { defaults+: { thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'red', value: 1 }] } } } },
          g.stat(4,
                 'Stalls per second, fleet',
                 'Operations across the fleet that exceeded their stall threshold, per second over %(w)s (sum of instance:stallwatch_stalls:rate%(w)s).' % f,
                 'suffix: stalls/s',
                 { h: 4, w: 6, x: 12, y: 1 },
                 [g.target('sum(instance:stallwatch_stalls:rate%(w)s{%(job)s})' % f)]),
          g.stat(5,
                 'Targets down',
                 'Targets whose last probe cycle failed or whose path is not the expected mount (stallwatch_target_up == 0). Alert: StallwatchTargetDown.',
                 'none',
                 { h: 4, w: 6, x: 18, y: 1 },
                 [g.target('count(stallwatch_target_up{%(job)s} == 0) or vector(0)' % f, instant=true)]),
          g.table(6,
                  'Hosts with a call blocked right now',
                  "Targets with a probe inside one system call for longer than %gs at this moment, with the age of the oldest such call (instance_target:stallwatch_probe_inflight_seconds:max). Empty when nothing is blocked. The agent's /api/stalls and the per-host dashboard show what the kernel was doing." % c.blockedCallSeconds,
                  's',
                  { h: 6, w: 24, x: 0, y: 5 },
                  [g.target('max by (instance, target) (instance_target:stallwatch_probe_inflight_seconds:max{%(job)s} and on (instance, job, target) instance_target:stallwatch_probe_blocked_calls:sum > 0)' % f, instant=true, format='table')])
          + hostLink + {
            transformations: [{ id: 'organize', options: { excludeByName: { Time: true }, renameByName: { Value: 'oldest call in flight' } } }],
          },

          g.row(7, 'Top hosts', 11),
          g.bargauge(8,
                     'Top hosts by fsync p99',
                     'The %(n)d hosts with the slowest fsync/fdatasync: the worst p99 over %(w)s of any of their targets (instance_target_mode_op:stallwatch_probe_duration_seconds:p99_%(w)s). Databases commit at this speed.' % f,
                     's',
                     { h: 9, w: 8, x: 0, y: 12 },
                     [g.target(
                       if native then 'topk(%d, max by (instance) (%s))' % [c.fleetTopN, u.probeQuantile(true, 0.99, 'instance, job, target, mode, op', fsyncSel, c.recordingWindow)]
                       else 'topk(%(n)d, max by (instance) (instance_target_mode_op:stallwatch_probe_duration_seconds:p99_%(w)s{%(job)s,op=~"fsync|fdatasync"}))' % f,
                       '{{instance}}',
                       instant=true
                     )])
          + hostLink,
          g.bargauge(9,
                     'Top hosts by stalls',
                     'The %(n)d hosts with the most operations over their stall threshold, per second over %(w)s (instance:stallwatch_stalls:rate%(w)s). Hosts without a stall are not listed.' % f,
                     'suffix: stalls/s',
                     { h: 9, w: 8, x: 8, y: 12 },
                     [g.target('topk(%(n)d, instance:stallwatch_stalls:rate%(w)s{%(job)s} > 0)' % f, '{{instance}}', instant=true)])
          + hostLink,
          g.bargauge(10,
                     'Top hosts by errors',
                     'The %(n)d hosts with the most failed probe calls (EIO, EROFS, ENOSPC, ...), per second over %(w)s (instance:stallwatch_probe_errors:rate%(w)s). Hosts without an error are not listed. Alert: StallwatchProbeErrors.' % f,
                     'suffix: errors/s',
                     { h: 9, w: 8, x: 16, y: 12 },
                     [g.target('topk(%(n)d, instance:stallwatch_probe_errors:rate%(w)s{%(job)s} > 0)' % f, '{{instance}}', instant=true)])
          + hostLink,

          g.row(11, 'By kernel release and filesystem type', 21),
          g.timeseries(12,
                       'Stall rate per host by kernel release',
                       'Stalls per second over %(w)s per host, averaged over the hosts running each kernel release (kernel_release:stallwatch_stalls:rate%(w)s divided by the hosts per release, from stallwatch_host_info). A release whose line rises after an upgrade is the suspect.' % f,
                       'suffix: stalls/s',
                       { h: 8, w: 12, x: 0, y: 22 },
                       [g.target('kernel_release:stallwatch_stalls:rate%(w)s{%(job)s} / on (job, kernel_release) count by (job, kernel_release) (stallwatch_host_info{%(job)s})' % f, '{{kernel_release}}')]),
          g.timeseries(13,
                       'fsync p99 by kernel release',
                       'p99 of fsync/fdatasync over %(w)s across all hosts of each kernel release, from the summed histogram buckets (instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate%(w)s joined with stallwatch_host_info). Where the engine keeps no buckets (a Prometheus with native histograms only): the p99 of the slowest target of each release (instance_target_mode_op:stallwatch_probe_duration_seconds:p99_%(w)s).' % f,
                       's',
                       { h: 8, w: 12, x: 12, y: 22 },
                       [g.target(if native then |||
                         histogram_quantile(0.99, sum by (kernel_release) (
                           rate(stallwatch_probe_duration_seconds{%(job)s,op=~"fsync|fdatasync"}[%(w)s])
                           * on (instance, job) group_left (kernel_release) stallwatch_host_info{%(job)s}
                         ))
                       ||| % f else |||
                         histogram_quantile(0.99, sum by (kernel_release, le) (
                           instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate%(w)s{%(job)s,op=~"fsync|fdatasync"}
                           * on (instance, job) group_left (kernel_release) stallwatch_host_info{%(job)s}
                         ))
                         or
                         max by (kernel_release) (
                           instance_target_mode_op:stallwatch_probe_duration_seconds:p99_%(w)s{%(job)s,op=~"fsync|fdatasync"}
                           * on (instance, job) group_left (kernel_release) stallwatch_host_info{%(job)s}
                         )
                       ||| % f, '{{kernel_release}}')]),
          g.timeseries(14,
                       'Stall rate by filesystem type',
                       'Stalls per second over %(w)s summed over the targets of each filesystem type (fstype:stallwatch_stalls:rate%(w)s, from stallwatch_target_info).' % f,
                       'suffix: stalls/s',
                       { h: 8, w: 12, x: 0, y: 30 },
                       [g.target('fstype:stallwatch_stalls:rate%(w)s{%(job)s}' % f, '{{fstype}}')]),
          g.table(15,
                  'Hosts per kernel release',
                  'How many hosts run each kernel release now (count by kernel_release of stallwatch_host_info), to weigh the by-release panels.',
                  'none',
                  { h: 8, w: 12, x: 12, y: 30 },
                  [g.target('count by (kernel_release) (stallwatch_host_info{%(job)s})' % f, instant=true, format='table')])
          + { transformations: [{ id: 'organize', options: { excludeByName: { Time: true }, renameByName: { Value: 'hosts' } } }] },

          g.row(16, 'Fleet latency', 38),
          g.panel('heatmap',
                  17,
                  'Fleet $op latency',
                  "Distribution of the $op call's duration over every host and target: each cell is the calls per second in one histogram bucket over %(w)s (sum by le of instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate%(w)s). A band far above the main one is the fleet's stall population; the top lists say which hosts it comes from." % f
                  + (if native then '' else ' Empty on a Prometheus that keeps only native histograms: build the dashboards with nativeHistograms: true there (docs/fleet.md).'),
                  's',
                  { h: 9, w: 24, x: 0, y: 39 },
                  [g.target(
                    if native then u.probeHeatmap(true, 'rate', '%(job)s,op=~"$op"' % f, c.recordingWindow)
                    else 'sum by (le) (instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate%(w)s{%(job)s,op=~"$op"})' % f,
                    if native then '' else '{{le}}',
                    format='heatmap'
                  )])
          + {
            options: {
              calculate: false,
              cellGap: 1,
              color: { mode: 'scheme', scheme: 'Oranges', exponent: 0.5, fill: 'dark-orange', reverse: false, scale: 'exponential', steps: 64 },
              filterValues: { le: 1e-09 },
              legend: { show: true },
              rowsFrame: { layout: 'le' },
              tooltip: { mode: 'single', yHistogram: false, showColorScale: false },
              yAxis: { axisPlacement: 'left', reverse: false, unit: 's' },
              cellValues: { unit: 'reqps' },
            },
          },
        ],
      },
  },
}
