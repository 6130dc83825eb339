// Selectors, thresholds and windows of the stallwatch mixin. The defaults are what
// deploy/stallwatch.rules.yml and the dashboards ship with.
{
  _config+:: {
    // Label matchers added to every stallwatch series the rules and alerts select, e.g.
    // 'job="stallwatch"' or 'role="storage"'. Empty: every series of that name.
    stallwatchSelector: '',
    // The scrape job StallwatchAbsent watches (deploy/prometheus.yml's job_name).
    stallwatchJob: 'stallwatch',

    // Each alert's runbook_url: %s is its section's anchor in docs/alerts.md (the alert
    // name in lower case). The default is the copy the Debian package installs with every
    // agent; point it at wherever you host the docs, e.g.
    // 'https://git.example.org/ops/stallwatch/src/branch/main/docs/alerts.md#%s'.
    runbookURLPattern: 'file:///usr/share/doc/stallwatch/docs/alerts.md#%s',

    // The stall_page_url annotation of the stall alerts (StallwatchProbeBlocked,
    // StallwatchStalls): the agent's /stalls page filtered to the alert's target, a
    // Prometheus template. The default fits when the instance label is the agent's own
    // host:port (deploy/prometheus.yml). Where relabelling makes it something else, or the
    // agent serves HTTPS (web-config), build the address from the labels you have, e.g.
    // 'https://{{ $labels.instance }}.storage.example.org:19858/stalls?target={{ $labels.target | urlquery }}'.
    stallPageURLPattern: 'http://{{ $labels.instance }}/stalls?target={{ $labels.target | urlquery }}',

    // Alert thresholds (seconds unless named otherwise) and their `for:` durations.
    // A probe inside one system call longer than this: StallwatchProbeBlocked.
    probeBlockedSeconds: 30,
    // p99 of fsync/fdatasync/dirsync: StallwatchFsyncLatencyHigh.
    fsyncP99Seconds: 0.5,
    fsyncP99For: '5m',
    // p99 of the append lane's fdatasync (a database commit), etcd's WAL guidance.
    commitP99Seconds: 0.01,
    commitP99For: '10m',
    // p99 of open(O_CREAT): StallwatchCreateLatencyHigh.
    createP99Seconds: 0.1,
    createP99For: '5m',
    // The window of the latency, stall and error alerts.
    alertWindow: '10m',
    targetDownFor: '2m',
    // (dirty + writeback) / dirty threshold: StallwatchDirtyNearThreshold.
    dirtyFraction: 0.8,
    dirtyFor: '2m',
    absentFor: '5m',

    // Recording rules: the rate window (the `5m` in their names) and the age above which
    // a call in flight counts as blocked (the agent's default stall_threshold).
    recordingWindow: '5m',
    blockedCallSeconds: 1,

    // Dashboards.
    // false: the latency panels read the classic buckets (stallwatch_probe_duration_seconds_bucket,
    // the `le` label) or, where an engine has none (a Prometheus 2.42 scraping protobuf with
    // native histograms keeps only the native histogram), the native histogram: `classic
    // or native`, so they work on Prometheus, on such a Prometheus and on VictoriaMetrics;
    // only the two heatmaps read the classic buckets alone. true: every latency panel
    // (the heatmaps too) reads only the native histogram (histogram_quantile over
    // rate(stallwatch_probe_duration_seconds[...]), no `le`). The recording rules and
    // alerts are the same either way (classic or native).
    nativeHistograms: false,
    dashboardTags: ['stallwatch', 'storage', 'raid'],
    hostDashboardUid: 'stallwatch',
    fleetDashboardUid: 'stallwatch-fleet',
    // How many hosts the fleet dashboard's top lists show.
    fleetTopN: 10,
  },
}
