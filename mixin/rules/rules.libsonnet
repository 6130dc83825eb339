// Recording rules: deploy/stallwatch.recording.rules.yml, tested in
// deploy/stallwatch.recording.rules.test.yml. Names follow Prometheus' level:metric:operations
// convention: the labels kept, the metric (without _total once rated), what was done.
// The fleet dashboard reads these; one rule is one entry of `rules` below.
local u = import '../lib/utils.libsonnet';

{
  prometheusRules+:: {
    local c = $._config,
    local f = {
      sel: u.selector([c.stallwatchSelector]),
      w: c.recordingWindow,
      blocked: c.blockedCallSeconds,
    },
    groups+: [
      {
        name: 'stallwatch.rules',
        rules: [
          // Latency buckets per lane and op: the input of the quantiles below and of the
          // fleet heatmap (sum by (le)).
          {
            record: 'instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate%(w)s' % f,
            expr: 'sum by (instance, job, target, mode, op, le) (rate(stallwatch_probe_duration_seconds_bucket%(sel)s[%(w)s]))' % f,
          },
        ] + [
          {
            record: 'instance_target_mode_op:stallwatch_probe_duration_seconds:p%d_%s' % [q * 100, c.recordingWindow],
            // The native histogram where a Prometheus keeps only that (see the alerts).
            expr: 'histogram_quantile(%g, instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate%s) or histogram_quantile(%g, sum by (instance, job, target, mode, op) (rate(stallwatch_probe_duration_seconds%s[%s])))' % [q, c.recordingWindow, q, f.sel, c.recordingWindow],
          }
          for q in [0.5, 0.99]
        ] + [
          // Stalls per second per op, and per host: top hosts, by kernel, by filesystem.
          {
            record: 'instance_target_mode_op:stallwatch_stalls:rate%(w)s' % f,
            expr: 'sum by (instance, job, target, mode, op) (rate(stallwatch_stalls_total%(sel)s[%(w)s]))' % f,
          },
          {
            record: 'instance:stallwatch_stalls:rate%(w)s' % f,
            expr: 'sum by (instance, job) (instance_target_mode_op:stallwatch_stalls:rate%(w)s)' % f,
          },
          // Failed calls per second by errno, and per host.
          {
            record: 'instance_target_mode_op_errno:stallwatch_probe_errors:rate%(w)s' % f,
            expr: 'sum by (instance, job, target, mode, op, errno) (rate(stallwatch_probe_errors_total%(sel)s[%(w)s]))' % f,
          },
          {
            record: 'instance:stallwatch_probe_errors:rate%(w)s' % f,
            expr: 'sum by (instance, job) (instance_target_mode_op_errno:stallwatch_probe_errors:rate%(w)s)' % f,
          },
          // Calls blocked right now: in flight longer than blockedCallSeconds (0 when none,
          // so a healthy target has a series too), and the oldest call in flight.
          {
            record: 'instance_target:stallwatch_probe_blocked_calls:sum',
            expr: 'sum by (instance, job, target) (stallwatch_probe_inflight_seconds%(sel)s >bool %(blocked)g)' % f,
          },
          {
            record: 'instance_target:stallwatch_probe_inflight_seconds:max',
            expr: 'max by (instance, job, target) (stallwatch_probe_inflight_seconds%(sel)s)' % f,
          },
          // Fleet groupings: stalls per second by the host's kernel release
          // (stallwatch_host_info) and by the target's filesystem type (stallwatch_target_info).
          {
            record: 'kernel_release:stallwatch_stalls:rate%(w)s' % f,
            expr: |||
              sum by (job, kernel_release) (
                instance:stallwatch_stalls:rate%(w)s
                * on (instance, job) group_left (kernel_release) stallwatch_host_info%(sel)s
              )
            ||| % f,
          },
          {
            record: 'fstype:stallwatch_stalls:rate%(w)s' % f,
            expr: |||
              sum by (job, fstype) (
                sum by (instance, job, target) (instance_target_mode_op:stallwatch_stalls:rate%(w)s)
                * on (instance, job, target) group_left (fstype) stallwatch_target_info%(sel)s
              )
            ||| % f,
          },
        ],
      },
    ],
  },
}
