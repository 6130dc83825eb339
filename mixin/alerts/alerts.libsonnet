// Alerting rules: deploy/stallwatch.rules.yml. Runbooks: docs/alerts.md, one section per
// alert, linked from each alert's runbook_url (_config.runbookURLPattern); promtool tests:
// deploy/stallwatch.rules.test.yml. One alert is one entry of `rules` below. Descriptions
// say what happened with the key values and the first thing to look at; the rest of what
// to look at and what to do is in the runbook.
local u = import '../lib/utils.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local s(extra='') = u.selector([c.stallwatchSelector, extra]),
    local f = {
      sel: s(),
      flushSel: s('op=~"fsync|fdatasync|dirsync"'),
      commitSel: s('mode="append",op="fdatasync"'),
      createSel: s('op="create"'),
      window: c.alertWindow,
      job: c.stallwatchJob,
    },
    // Every alert links to its section of docs/alerts.md: the anchor is the heading's
    // GitHub slug, the alert name in lower case.
    local withRunbook(rule) = rule {
      annotations+: { runbook_url: c.runbookURLPattern % std.asciiLower(rule.alert) },
    },
    groups+: [
      {
        name: 'stallwatch',
        rules: std.map(withRunbook, [
          // A probe is stuck in a system call right now. The gauge rises while the call
          // is blocked, so this fires during the stall, not after it returns. The cause
          // label is where the kernel holds the call (stallwatch_probe_blocked_cause,
          // sampled from a quarter of the stall threshold on); "unknown" where that gauge
          // has no series (agents before 0.2.0).
          {
            alert: 'StallwatchProbeBlocked',
            expr: |||
              (stallwatch_probe_inflight_seconds%(sel)s > %(t)g)
                * ignoring (cause) group_left (cause)
                stallwatch_probe_blocked_cause%(sel)s
              or
              label_replace(stallwatch_probe_inflight_seconds%(sel)s > %(t)g, "cause", "unknown", "", "")
                unless ignoring (cause)
                stallwatch_probe_blocked_cause%(sel)s
            ||| % (f { t: c.probeBlockedSeconds }),
            labels: { severity: 'critical' },
            annotations: {
              summary: '{{ $labels.op }} on {{ $labels.target }} ({{ $labels.instance }}) blocked for {{ $value | humanizeDuration }}, cause {{ $labels.cause }}',
              description: u.fold(|||
                The {{ $labels.mode }} probe on target {{ $labels.target }} of {{ $labels.instance }}
                has been inside {{ $labels.op }}() for {{ $value | humanizeDuration }} and has not
                returned; the kernel holds it in a wait point of cause "{{ $labels.cause }}".
                Applications writing to this filesystem are most likely blocked too.
                Look at: %s for the ongoing stall; the runbook lists the rest.
              ||| % c.stallPageURLPattern),
              stall_page_url: c.stallPageURLPattern,
            },
          },

          // The latency alerts read the classic buckets, or the native histogram where a
          // Prometheus scraping protobuf with native histograms keeps only that (2.42-2.44,
          // and later ones without scrape_classic_histograms).

          // p99 of fsync/fdatasync over the alert window.
          {
            alert: 'StallwatchFsyncLatencyHigh',
            expr: |||
              (
                histogram_quantile(0.99,
                  sum by (instance, job, target, mode, op, le) (
                    rate(stallwatch_probe_duration_seconds_bucket%(flushSel)s[%(window)s])
                  )
                )
                or
                histogram_quantile(0.99,
                  sum by (instance, job, target, mode, op) (
                    rate(stallwatch_probe_duration_seconds%(flushSel)s[%(window)s])
                  )
                )
              ) > %(t)g
            ||| % (f { t: c.fsyncP99Seconds }),
            'for': c.fsyncP99For,
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $labels.op }} p99 on {{ $labels.target }} ({{ $labels.instance }}) is {{ $value | humanizeDuration }}',
              description: u.fold(|||
                Over the last %(w)s the 99th percentile of {{ $labels.op }}() in the
                {{ $labels.mode }} probe on {{ $labels.target }} of {{ $labels.instance }} was
                {{ $value | humanizeDuration }} (threshold %(t)s); databases commit no faster.
                Look at: the dashboard's latency heatmap for when it started; the runbook
                lists the rest.
              ||| % { w: u.durationWords(c.alertWindow), t: u.humanSeconds(c.fsyncP99Seconds) }),
            },
          },

          // p99 of the database commit (append mode: write at the end of a log, then
          // fdatasync) over the alert window, against etcd's guidance for its WAL.
          {
            alert: 'StallwatchCommitLatencyHigh',
            expr: |||
              (
                histogram_quantile(0.99,
                  sum by (instance, job, target, op, le) (
                    rate(stallwatch_probe_duration_seconds_bucket%(commitSel)s[%(window)s])
                  )
                )
                or
                histogram_quantile(0.99,
                  sum by (instance, job, target, op) (
                    rate(stallwatch_probe_duration_seconds%(commitSel)s[%(window)s])
                  )
                )
              ) > %(t)g
            ||| % (f { t: c.commitP99Seconds }),
            'for': c.commitP99For,
            labels: { severity: 'warning' },
            annotations: {
              summary: 'commit p99 on {{ $labels.target }} ({{ $labels.instance }}) is {{ $value | humanizeDuration }}',
              description: u.fold(|||
                Over the last %(w)s the 99th percentile of fdatasync() after an append in
                the append probe on {{ $labels.target }} of {{ $labels.instance }} was
                {{ $value | humanizeDuration }} (threshold %(t)s, etcd's guidance for WAL
                fsync); a database on this filesystem commits no faster. Look at: whether the
                overwrite probe's fsync is slow too; the runbook lists the rest.
              ||| % { w: u.durationWords(c.alertWindow), t: u.humanSeconds(c.commitP99Seconds) }),
            },
          },

          // p99 of open(O_CREAT) over the alert window.
          {
            alert: 'StallwatchCreateLatencyHigh',
            expr: |||
              (
                histogram_quantile(0.99,
                  sum by (instance, job, target, mode, op, le) (
                    rate(stallwatch_probe_duration_seconds_bucket%(createSel)s[%(window)s])
                  )
                )
                or
                histogram_quantile(0.99,
                  sum by (instance, job, target, mode, op) (
                    rate(stallwatch_probe_duration_seconds%(createSel)s[%(window)s])
                  )
                )
              ) > %(t)g
            ||| % (f { t: c.createP99Seconds }),
            'for': c.createP99For,
            labels: { severity: 'warning' },
            annotations: {
              summary: 'create p99 on {{ $labels.target }} ({{ $labels.instance }}) is {{ $value | humanizeDuration }}',
              description: u.fold(|||
                Over the last %(w)s the 99th percentile of open(O_CREAT) of an empty file
                in the {{ $labels.mode }} probe on {{ $labels.target }} of {{ $labels.instance }}
                was {{ $value | humanizeDuration }} (threshold %(t)s; normally well under 1ms).
                Look at: who is writing to the same filesystem (`pidstat -d 1`); the runbook
                lists the rest.
              ||| % { w: u.durationWords(c.alertWindow), t: u.humanSeconds(c.createP99Seconds) }),
            },
          },

          // Any operation slower than the agent's stall_threshold (default 1s) in the
          // alert window, one alert per cause (where the kernel held the call: frozen,
          // dirty_throttle, journal, writeback_wait, device_queue, metadata_buffer, md,
          // remote, other, unknown; empty from agents before 0.2.0). The second branch catches the first
          // stall of a series that did not exist a window ago (increase() needs two samples).
          {
            alert: 'StallwatchStalls',
            expr: |||
              sum by (instance, job, target, mode, op, cause) (increase(stallwatch_stalls_total%(sel)s[%(window)s])) > 0
              or
              sum by (instance, job, target, mode, op, cause) (stallwatch_stalls_total%(sel)s unless stallwatch_stalls_total%(sel)s offset %(window)s) > 0
            ||| % f,
            labels: { severity: 'warning' },
            annotations: {
              summary: '{{ $value | humanize }} {{ $labels.op }} stall(s) on {{ $labels.target }} ({{ $labels.instance }}) in %s, cause {{ $labels.cause }}' % u.durationWords(c.alertWindow),
              description: u.fold(|||
                {{ $labels.op }}() in the {{ $labels.mode }} probe on {{ $labels.target }} of
                {{ $labels.instance }} exceeded the stall threshold {{ $value | humanize }} time(s)
                in the last %s; the kernel held it in a wait point of cause
                "{{ $labels.cause }}". Look at: %s for each stall's verdict; the runbook says
                what each cause means and what to do.
              ||| % [u.durationWords(c.alertWindow), c.stallPageURLPattern]),
              stall_page_url: c.stallPageURLPattern,
            },
          },

          // Failed operations by errno (EIO, ENOSPC, EROFS, EACCES, ...).
          {
            alert: 'StallwatchProbeErrors',
            expr: |||
              sum by (instance, job, target, mode, op, errno) (increase(stallwatch_probe_errors_total%(sel)s[%(window)s])) > 0
              or
              sum by (instance, job, target, mode, op, errno) (stallwatch_probe_errors_total%(sel)s unless stallwatch_probe_errors_total%(sel)s offset %(window)s) > 0
            ||| % f,
            labels: { severity: 'critical' },
            annotations: {
              summary: '{{ $labels.op }} failed with {{ $labels.errno }} on {{ $labels.target }} ({{ $labels.instance }})',
              description: u.fold(|||
                {{ $labels.op }}() in the {{ $labels.mode }} probe on {{ $labels.target }} of
                {{ $labels.instance }} failed with {{ $labels.errno }} {{ $value | humanize }} time(s)
                in the last %s. Look at: dmesg; the runbook says what each errno means (EIO
                after fsync: application data may be lost).
              ||| % u.durationWords(c.alertWindow)),
            },
          },

          // The last probe cycle failed, or the path is not the expected mount point.
          {
            alert: 'StallwatchTargetDown',
            expr: 'stallwatch_target_up%(sel)s == 0' % f,
            'for': c.targetDownFor,
            labels: { severity: 'critical' },
            annotations: {
              summary: 'stallwatch target {{ $labels.target }} on {{ $labels.instance }} is down',
              description: u.fold(|||
                The last probe cycles on target {{ $labels.target }} of {{ $labels.instance }} did
                not succeed on the expected mount for %s. Look at: the target's state on
                http://{{ $labels.instance }}/ and whether the filesystem is mounted; the runbook
                lists the rest.
              ||| % u.durationWords(c.targetDownFor)),
            },
          },

          // Dirty + writeback memory close to the point where the kernel blocks every writer.
          {
            alert: 'StallwatchDirtyNearThreshold',
            expr: |||
              (stallwatch_vm_dirty_bytes%(sel)s + stallwatch_vm_writeback_bytes%(sel)s)
                / (stallwatch_vm_dirty_threshold_bytes%(sel)s > 0)
              > %(t)g
            ||| % (f { t: c.dirtyFraction }),
            'for': c.dirtyFor,
            labels: { severity: 'warning' },
            annotations: {
              summary: 'dirty memory on {{ $labels.instance }} at {{ $value | humanizePercentage }} of the dirty threshold',
              description: u.fold(|||
                Dirty plus writeback page-cache memory on {{ $labels.instance }} has been above %(p)s
                of the kernel's dirty threshold (now {{ $value | humanizePercentage }}) for %(w)s;
                at the threshold every process that writes is throttled. Look at: which process
                dirties memory (`pidstat -d 1`); the runbook lists the rest.
              ||| % { p: u.percent(c.dirtyFraction), w: u.durationWords(c.dirtyFor) }),
            },
          },

          // The agent itself is not scraped.
          {
            alert: 'StallwatchAbsent',
            expr: |||
              up{job="%(job)s"} == 0
              or
              absent(up{job="%(job)s"})
            ||| % f,
            'for': c.absentFor,
            labels: { severity: 'critical' },
            annotations: {
              summary: 'stallwatch on {{ $labels.instance }} is not being scraped',
              description: u.fold(|||
                Prometheus has not scraped stallwatch on {{ $labels.instance }} (job
                {{ $labels.job }}) for %s, so none of the other stallwatch alerts can fire
                for that host (an empty instance: no stallwatch target exists in the job). Look
                at: `systemctl status stallwatch`; the runbook lists the rest.
              ||| % u.durationWords(c.absentFor)),
            },
          },
        ]),
      },
    ],
  },
}
