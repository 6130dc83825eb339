// The per-host dashboard: grafana/stallwatch.json. One panel is one object of `panels`;
// rows group the panels that follow them (gridPos is absolute, y grows downwards).
local ds = (import '../lib/grafana.libsonnet').datasource;
local u = import '../lib/utils.libsonnet';

{
  grafanaDashboards+:: {
    'stallwatch.json': {
      local native = $._config.nativeHistograms,
      local sel = 'instance=~"$instance",target=~"$target"',
      __requires: [
        {
          type: 'grafana',
          id: 'grafana',
          name: 'Grafana',
          version: '10.0.0',
        },
        {
          type: 'datasource',
          id: 'prometheus',
          name: 'Prometheus',
          version: '1.0.0',
        },
        {
          type: 'panel',
          id: 'timeseries',
          name: 'Time series',
          version: '',
        },
        {
          type: 'panel',
          id: 'heatmap',
          name: 'Heatmap',
          version: '',
        },
        {
          type: 'panel',
          id: 'stat',
          name: 'Stat',
          version: '',
        },
        {
          type: 'panel',
          id: 'table',
          name: 'Table',
          version: '',
        },
        {
          type: 'panel',
          id: 'state-timeline',
          name: 'State timeline',
          version: '',
        },
      ],
      id: null,
      uid: $._config.hostDashboardUid,
      title: 'stallwatch: storage stalls',
      description: "Per-syscall latency of stallwatch's create/write/fsync probes, blocked probes, stalls, errors, the kernel's dirty-page and writeback state, io pressure and md RAID sync state.",
      tags: $._config.dashboardTags,
      editable: true,
      graphTooltip: 1,
      time: {
        from: 'now-6h',
        to: 'now',
      },
      refresh: '30s',
      timezone: '',
      schemaVersion: 39,
      version: 1,
      fiscalYearStartMonth: 0,
      liveNow: false,
      weekStart: '',
      links: [],
      annotations: {
        list: [
          {
            builtIn: 1,
            datasource: {
              type: 'grafana',
              uid: '-- Grafana --',
            },
            enable: true,
            hide: true,
            iconColor: 'rgba(0, 211, 255, 1)',
            name: 'Annotations & Alerts',
            type: 'dashboard',
          },
          {
            name: 'Stalls',
            enable: true,
            hide: false,
            iconColor: 'red',
            datasource: ds,
            expr: 'sum by (instance, target, mode, op, cause) (increase(stallwatch_stalls_total{instance=~"$instance",target=~"$target"}[$__rate_interval])) > 0',
            step: '$__rate_interval',
            titleFormat: 'stall: {{target}} {{mode}}/{{op}} ({{cause}})',
            textFormat: '{{instance}}: an op exceeded the stall threshold, held in the kernel by: {{cause}}; verdict and details at /api/stalls',
            tagKeys: 'target,op,cause',
            useValueForTime: false,
          },
        ],
      },
      templating: {
        list: [
          {
            type: 'datasource',
            name: 'datasource',
            label: 'Data source',
            query: 'prometheus',
            regex: '',
            current: {},
            options: [],
            refresh: 1,
            hide: 0,
            includeAll: false,
            multi: false,
            description: 'The Prometheus that scrapes stallwatch.',
          },
          {
            type: 'query',
            name: 'instance',
            label: 'Instance',
            description: 'Hosts running stallwatch (instance label of stallwatch_build_info).',
            datasource: ds,
            definition: 'label_values(stallwatch_build_info, instance)',
            query: {
              query: 'label_values(stallwatch_build_info, instance)',
              refId: 'instance-query',
              qryType: 1,
            },
            refresh: 2,
            regex: '',
            sort: 1,
            multi: true,
            includeAll: true,
            current: {},
            options: [],
            hide: 0,
            allValue: '.+',
          },
          {
            type: 'query',
            name: 'target',
            label: 'Target',
            description: 'Probed targets on the selected hosts.',
            datasource: ds,
            definition: 'label_values(stallwatch_target_up{instance=~"$instance"}, target)',
            query: {
              query: 'label_values(stallwatch_target_up{instance=~"$instance"}, target)',
              refId: 'target-query',
              qryType: 1,
            },
            refresh: 2,
            regex: '',
            sort: 1,
            multi: true,
            includeAll: true,
            current: {},
            options: [],
            hide: 0,
            allValue: '.+',
          },
          {
            type: 'query',
            name: 'op',
            label: 'Op',
            description: 'Timed system calls, for the heatmaps.',
            datasource: ds,
            definition: 'label_values(%s, op)' % u.probeSeries(native, sel),
            query: {
              query: 'label_values(%s, op)' % u.probeSeries(native, sel),
              refId: 'op-query',
              qryType: 1,
            },
            refresh: 2,
            regex: '',
            sort: 1,
            multi: true,
            includeAll: true,
            current: {},
            options: [],
            hide: 0,
            allValue: '.+',
          },
        ],
      },
      panels: [

        // ---- row: Overview
        {
          type: 'row',
          id: 1,
          title: 'Overview',
          collapsed: false,
          gridPos: {
            h: 1,
            w: 24,
            x: 0,
            y: 0,
          },
          panels: [],
        },
        {
          type: 'stat',
          id: 2,
          title: 'Target up',
          description: 'stallwatch_target_up per target: UP when the last probe cycle succeeded on the expected mount point, DOWN when it failed or the path is not the mount it should be (unmounted, replaced). Alert: StallwatchTargetDown.',
          datasource: ds,
          gridPos: {
            h: 5,
            w: 6,
            x: 0,
            y: 1,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_target_up{instance=~"$instance",target=~"$target"}',
              legendFormat: '{{target}}',
              refId: 'A',
              range: false,
              instant: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'red',
                    value: null,
                  },
                  {
                    color: 'green',
                    value: 1,
                  },
                ],
              },
              mappings: [
                {
                  type: 'value',
                  options: {
                    '0': {
                      text: 'DOWN',
                      color: 'red',
                      index: 0,
                    },
                    '1': {
                      text: 'UP',
                      color: 'green',
                      index: 1,
                    },
                  },
                },
              ],
            },
            overrides: [],
          },
          options: {
            reduceOptions: {
              calcs: [
                'lastNotNull',
              ],
              fields: '',
              values: false,
            },
            colorMode: 'background',
            graphMode: 'none',
            textMode: 'value_and_name',
            justifyMode: 'auto',
            orientation: 'auto',
          },
        },
        {
          type: 'stat',
          id: 3,
          title: 'Blocked right now',
          description: 'Age of the oldest probe operation in flight per target, right now (stallwatch_probe_inflight_seconds; 0 when no call is pending). It grows while a call is blocked in the kernel, before the call returns. Alert: StallwatchProbeBlocked above 30s.',
          datasource: ds,
          gridPos: {
            h: 5,
            w: 6,
            x: 6,
            y: 1,
          },
          targets: [
            {
              datasource: ds,
              expr: 'max by (target) (stallwatch_probe_inflight_seconds{instance=~"$instance",target=~"$target"})',
              legendFormat: '{{target}}',
              refId: 'A',
              range: false,
              instant: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'green',
                    value: null,
                  },
                  {
                    color: 'orange',
                    value: 1,
                  },
                  {
                    color: 'red',
                    value: 30,
                  },
                ],
              },
            },
            overrides: [],
          },
          options: {
            reduceOptions: {
              calcs: [
                'lastNotNull',
              ],
              fields: '',
              values: false,
            },
            colorMode: 'background',
            graphMode: 'none',
            textMode: 'value_and_name',
            justifyMode: 'auto',
            orientation: 'auto',
          },
        },
        {
          type: 'stat',
          id: 4,
          title: 'Stalls in range',
          description: "Operations slower than the stall threshold during the dashboard's time range, per target (increase of stallwatch_stalls_total). Details of each stall: the agent's /api/stalls. Alert: StallwatchStalls.",
          datasource: ds,
          gridPos: {
            h: 5,
            w: 6,
            x: 12,
            y: 1,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (target) (increase(stallwatch_stalls_total{instance=~"$instance",target=~"$target"}[$__range]))',
              legendFormat: '{{target}}',
              refId: 'A',
              range: false,
              instant: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'green',
                    value: null,
                  },
                  {
                    color: 'orange',
                    value: 1,
                  },
                ],
              },
            },
            overrides: [],
          },
          options: {
            reduceOptions: {
              calcs: [
                'lastNotNull',
              ],
              fields: '',
              values: false,
            },
            colorMode: 'background',
            graphMode: 'none',
            textMode: 'value_and_name',
            justifyMode: 'auto',
            orientation: 'auto',
          },
        },
        {
          type: 'stat',
          id: 5,
          title: 'Errors in range',
          description: "Failed probe operations (any errno) during the dashboard's time range, per target (increase of stallwatch_probe_errors_total). Which errno: the Errors panel. Alert: StallwatchProbeErrors.",
          datasource: ds,
          gridPos: {
            h: 5,
            w: 6,
            x: 18,
            y: 1,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (target) (increase(stallwatch_probe_errors_total{instance=~"$instance",target=~"$target"}[$__range]))',
              legendFormat: '{{target}}',
              refId: 'A',
              range: false,
              instant: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'green',
                    value: null,
                  },
                  {
                    color: 'red',
                    value: 1,
                  },
                ],
              },
            },
            overrides: [],
          },
          options: {
            reduceOptions: {
              calcs: [
                'lastNotNull',
              ],
              fields: '',
              values: false,
            },
            colorMode: 'background',
            graphMode: 'none',
            textMode: 'value_and_name',
            justifyMode: 'auto',
            orientation: 'auto',
          },
        },
        {
          type: 'table',
          id: 6,
          title: 'Targets',
          description: 'What each target probes (stallwatch_target_info): path, mount point, backing device, filesystem type and mount options (barrier/nobarrier matter when comparing hosts), and the time of the last successful probe cycle (stallwatch_last_success_timestamp_seconds).',
          datasource: ds,
          gridPos: {
            h: 6,
            w: 18,
            x: 0,
            y: 6,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_target_info{instance=~"$instance",target=~"$target"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'A',
              legendFormat: '',
            },
            {
              datasource: ds,
              expr: 'stallwatch_last_success_timestamp_seconds{instance=~"$instance",target=~"$target"} * 1000',
              format: 'table',
              instant: true,
              range: false,
              refId: 'B',
              legendFormat: '',
            },
          ],
          transformations: [
            {
              id: 'merge',
              options: {},
            },
            {
              id: 'organize',
              options: {
                excludeByName: {
                  Time: true,
                  'Value #A': true,
                  __name__: true,
                  job: true,
                },
                indexByName: {
                  instance: 0,
                  target: 1,
                  path: 2,
                  mountpoint: 3,
                  device: 4,
                  fstype: 5,
                  options: 6,
                  'Value #B': 7,
                },
                renameByName: {
                  'Value #B': 'last success',
                },
              },
            },
          ],
          fieldConfig: {
            defaults: {
              custom: {
                align: 'auto',
              },
              unit: 'none',
            },
            overrides: [
              {
                matcher: {
                  id: 'byName',
                  options: 'last success',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 'dateTimeFromNow',
                  },
                ],
              },
            ],
          },
          options: {
            showHeader: true,
          },
        },
        {
          type: 'stat',
          id: 7,
          title: 'Agent version',
          description: 'stallwatch version per host (stallwatch_build_info). Compare latency across hosts only with the same agent version, kernel and mount options.',
          datasource: ds,
          gridPos: {
            h: 6,
            w: 6,
            x: 18,
            y: 6,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_build_info{instance=~"$instance"}',
              legendFormat: '{{instance}}: {{version}}',
              refId: 'A',
              range: false,
              instant: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'blue',
                    value: null,
                  },
                ],
              },
            },
            overrides: [],
          },
          options: {
            reduceOptions: {
              calcs: [
                'lastNotNull',
              ],
              fields: '',
              values: false,
            },
            colorMode: 'none',
            graphMode: 'none',
            textMode: 'name',
            justifyMode: 'auto',
            orientation: 'auto',
          },
        },

        // ---- row: Latency
        {
          type: 'row',
          id: 8,
          title: 'Latency',
          collapsed: false,
          gridPos: {
            h: 1,
            w: 24,
            x: 0,
            y: 12,
          },
          panels: [],
        },
        {
          type: 'timeseries',
          id: 9,
          title: 'p50 latency by target and op',
          description: 'Median duration of each timed system call (create, close, unlink, write, fsync, fdatasync, rename, dirsync) per target and probe mode, from the stallwatch_probe_duration_seconds histogram. Log scale.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 13,
          },
          targets: [
            {
              datasource: ds,
              expr: u.probeQuantile(native, 0.5, 'instance, target, mode, op', sel, '$__rate_interval'),
              legendFormat: '{{target}} {{mode}}/{{op}}',
              refId: 'A',
              range: true,
              instant: false,
              // The stall_id exemplars of the slow calls: a click leads to /stalls/{id}.
              exemplar: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
                scaleDistribution: {
                  type: 'log',
                  log: 10,
                },
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 10,
          title: 'p99 latency by target and op',
          description: '99th percentile of each timed system call per target and probe mode. A p99 far above the p50 is the stall pattern: most calls are fast, some wait behind writeback or a full log. Alerts: StallwatchFsyncLatencyHigh (fsync p99 over 10m > 500ms), StallwatchCreateLatencyHigh (create p99 > 100ms).',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 13,
          },
          targets: [
            {
              datasource: ds,
              expr: u.probeQuantile(native, 0.99, 'instance, target, mode, op', sel, '$__rate_interval'),
              legendFormat: '{{target}} {{mode}}/{{op}}',
              refId: 'A',
              range: true,
              instant: false,
              // The stall_id exemplars of the slow calls: a click leads to /stalls/{id}.
              exemplar: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
                scaleDistribution: {
                  type: 'log',
                  log: 10,
                },
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 11,
          title: 'Max latency by target and op',
          description: 'Slowest call per interval, as histogram_quantile(1, ...): the upper bound of the highest histogram bucket that received a call (there is no max gauge), so it overstates the true maximum by up to one bucket width. A call that has not returned yet is not in the histogram: see In-flight age.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 21,
          },
          targets: [
            {
              datasource: ds,
              expr: u.probeQuantile(native, 1, 'instance, target, mode, op', sel, '$__rate_interval'),
              legendFormat: '{{target}} {{mode}}/{{op}}',
              refId: 'A',
              range: true,
              instant: false,
              // The stall_id exemplars of the slow calls: a click leads to /stalls/{id}.
              exemplar: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
                scaleDistribution: {
                  type: 'log',
                  log: 10,
                },
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 12,
          title: 'In-flight age',
          description: 'Age of the operation each probe is inside right now (stallwatch_probe_inflight_seconds), 0 when none. A rising sawtooth is a call blocked in the kernel, visible before it returns; the dashed line is the StallwatchProbeBlocked threshold (30s).',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 21,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_probe_inflight_seconds{instance=~"$instance",target=~"$target"}',
              legendFormat: '{{target}} {{mode}}/{{op}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
                thresholdsStyle: {
                  mode: 'dashed',
                },
              },
              color: {
                mode: 'palette-classic',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'transparent',
                    value: null,
                  },
                  {
                    color: 'red',
                    value: 30,
                  },
                ],
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 31,
          title: 'Database commit latency (append)',
          description: "The append probe's database commit: write() at the end of a log file, then fdatasync(), which must commit the new size with the data, as PostgreSQL's WAL, etcd's WAL and InnoDB's redo log do. p50 and p99 of each of the two calls per target (stallwatch_probe_duration_seconds{mode=\"append\"}). etcd's guidance is a WAL fdatasync p99 under 10ms. Alert: StallwatchCommitLatencyHigh.",
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 29,
          },
          targets: [
            {
              datasource: ds,
              expr: u.probeQuantile(native, 0.5, 'instance, target, op', sel + ',mode="append"', '$__rate_interval'),
              legendFormat: '{{target}} p50 {{op}}',
              refId: 'A',
              range: true,
              instant: false,
              // The stall_id exemplars of the slow calls: a click leads to /stalls/{id}.
              exemplar: true,
            },
            {
              datasource: ds,
              expr: u.probeQuantile(native, 0.99, 'instance, target, op', sel + ',mode="append"', '$__rate_interval'),
              legendFormat: '{{target}} p99 {{op}}',
              refId: 'B',
              range: true,
              instant: false,
              // The stall_id exemplars of the slow calls: a click leads to /stalls/{id}.
              exemplar: true,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
                scaleDistribution: {
                  type: 'log',
                  log: 10,
                },
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'state-timeline',
          id: 32,
          title: 'Lanes up',
          description: "Each probe mode of a target runs in its own lane (thread, schedule, in-flight slot). 1 when the lane's last cycle succeeded (stallwatch_lane_up); stallwatch_target_up is 1 when all of a target's lanes are. One lane down while the others of its target stay up points at that kind of operation (e.g. only fsync failing); all down at the filesystem.",
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 29,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_lane_up{instance=~"$instance",target=~"$target"}',
              legendFormat: '{{target}} {{mode}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'red',
                    value: null,
                  },
                  {
                    color: 'green',
                    value: 1,
                  },
                ],
              },
              custom: {
                fillOpacity: 70,
                lineWidth: 0,
              },
              mappings: [
                {
                  type: 'value',
                  options: {
                    '0': {
                      text: 'DOWN',
                    },
                    '1': {
                      text: 'UP',
                    },
                  },
                },
              ],
              unit: 'none',
            },
            overrides: [],
          },
          options: {
            showValue: 'never',
            mergeValues: true,
            rowHeight: 0.9,
            alignValue: 'left',
            legend: {
              showLegend: false,
              displayMode: 'list',
              placement: 'bottom',
            },
            tooltip: {
              mode: 'single',
            },
          },
        },

        // ---- row: Latency heatmaps: $target
        {
          type: 'row',
          id: 13,
          title: 'Latency heatmaps: $target',
          collapsed: false,
          gridPos: {
            h: 1,
            w: 24,
            x: 0,
            y: 37,
          },
          panels: [],
          repeat: 'target',
          description: 'One row per selected target, one heatmap per selected op.',
        },
        {
          type: 'heatmap',
          id: 14,
          title: '$target: $op latency',
          description: "Distribution of the $op call's duration on target $target over time: each column counts the calls per histogram bucket (increase of stallwatch_probe_duration_seconds_bucket). A second band far above the main one is the stall population." + (if native then '' else ' Empty on a Prometheus that keeps only native histograms: build the dashboards with nativeHistograms: true there (docs/fleet.md).'),
          datasource: ds,
          repeat: 'op',
          repeatDirection: 'h',
          maxPerRow: 4,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 38,
          },
          targets: [
            {
              datasource: ds,
              expr: u.probeHeatmap(native, 'increase', sel + ',op=~"$op"', '$__rate_interval'),
              format: 'heatmap',
              legendFormat: '{{le}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              custom: {
                scaleDistribution: {
                  type: 'linear',
                },
                hideFrom: {
                  legend: false,
                  tooltip: false,
                  viz: false,
                },
              },
            },
            overrides: [],
          },
          options: {
            calculate: false,
            cellGap: 1,
            color: {
              mode: 'scheme',
              scheme: 'Oranges',
              exponent: 0.5,
              fill: 'dark-orange',
              reverse: false,
              scale: 'exponential',
              steps: 64,
            },
            exemplars: {
              color: 'rgba(255,0,255,0.7)',
            },
            filterValues: {
              le: 1e-09,
            },
            legend: {
              show: true,
            },
            rowsFrame: {
              layout: 'le',
            },
            tooltip: {
              mode: 'single',
              yHistogram: false,
              showColorScale: false,
            },
            yAxis: {
              axisPlacement: 'left',
              reverse: false,
              unit: 's',
            },
            cellValues: {
              unit: 'short',
            },
          },
        },

        // ---- row: Stalls and errors
        {
          type: 'row',
          id: 15,
          title: 'Stalls and errors',
          collapsed: false,
          gridPos: {
            h: 1,
            w: 24,
            x: 0,
            y: 46,
          },
          panels: [],
        },
        {
          type: 'timeseries',
          id: 16,
          title: 'Stalls over time',
          description: 'Operations that crossed the stall threshold, per target, mode and op (increase of stallwatch_stalls_total). Counted when the threshold is crossed, not when the call returns. Stalls also show as annotations on every panel.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 47,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (target, mode, op) (increase(stallwatch_stalls_total{instance=~"$instance",target=~"$target"}[$__rate_interval]))',
              legendFormat: '{{target}} {{mode}}/{{op}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              custom: {
                drawStyle: 'bars',
                lineWidth: 1,
                fillOpacity: 80,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 17,
          title: 'Errors by errno',
          description: "Failed probe operations per target, op and errno (EIO, ENOSPC, EROFS, EACCES, ...), from stallwatch_probe_errors_total. EIO: device or array error; EROFS: remounted read-only; EACCES: the unit's ReadWritePaths= or PATH/.stallwatch ownership.",
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 47,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (target, op, errno) (increase(stallwatch_probe_errors_total{instance=~"$instance",target=~"$target"}[$__rate_interval]))',
              legendFormat: '{{target}} {{op}} {{errno}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              custom: {
                drawStyle: 'bars',
                lineWidth: 1,
                fillOpacity: 80,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 18,
          title: 'Probe cycles and skips',
          description: 'Completed probe cycles per second per target and mode (stallwatch_probes_total), and cycles not started (stallwatch_probes_skipped_total) by reason: in_flight means the previous cycle was still blocked, not_mounted that the path was not the expected mount.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 55,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (target, mode) (rate(stallwatch_probes_total{instance=~"$instance",target=~"$target"}[$__rate_interval]))',
              legendFormat: '{{target}} {{mode}} completed',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'sum by (target, reason) (rate(stallwatch_probes_skipped_total{instance=~"$instance",target=~"$target"}[$__rate_interval]))',
              legendFormat: '{{target}} skipped: {{reason}}',
              refId: 'B',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'ops',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 19,
          title: 'Target up and time since last success',
          description: 'stallwatch_target_up per target (1 up, 0 down), stallwatch_target_read_only (1 when the filesystem is mounted or was remounted read-only, e.g. after errors), both on the right axis, and the seconds since the last successful cycle (time() - stallwatch_last_success_timestamp_seconds). Alert: StallwatchTargetDown.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 55,
          },
          targets: [
            {
              datasource: ds,
              expr: 'time() - stallwatch_last_success_timestamp_seconds{instance=~"$instance",target=~"$target"}',
              legendFormat: '{{target}} since last success',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'stallwatch_target_up{instance=~"$instance",target=~"$target"}',
              legendFormat: '{{target}} up',
              refId: 'B',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'stallwatch_target_read_only{instance=~"$instance",target=~"$target"}',
              legendFormat: '{{target}} read-only',
              refId: 'C',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 's',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [
              {
                matcher: {
                  id: 'byRegexp',
                  options: '.* (up|read-only)$',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 'none',
                  },
                  {
                    id: 'custom.axisPlacement',
                    value: 'right',
                  },
                  {
                    id: 'max',
                    value: 1,
                  },
                  {
                    id: 'custom.drawStyle',
                    value: 'line',
                  },
                  {
                    id: 'custom.lineInterpolation',
                    value: 'stepAfter',
                  },
                ],
              },
            ],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },

        // Where the kernel held the stalled calls (issue 12).
        {
          type: 'timeseries',
          id: 33,
          title: 'Stalls by cause',
          description: "Stalls per cause: where the kernel held the call, from the wait-point samples the agent took before the threshold was crossed (frozen, dirty_throttle, journal, writeback_wait, device_queue, metadata_buffer, md, remote; other: a wait point not in the agent's table; unknown: not sampled). Label cause of stallwatch_stalls_total. Each stall's verdict and samples: /api/stalls.",
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 63,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (cause) (increase(stallwatch_stalls_total{instance=~"$instance",target=~"$target"}[$__rate_interval]))',
              legendFormat: '{{cause}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              custom: {
                drawStyle: 'bars',
                lineWidth: 1,
                fillOpacity: 80,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 34,
          title: 'Blocked now, by cause',
          description: 'Probe calls blocked past their sampling point (a quarter of the stall threshold) right now, by the cause sampled so far (stallwatch_probe_blocked_cause). Empty while nothing is blocked.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 63,
          },
          targets: [
            {
              datasource: ds,
              expr: 'sum by (target, mode, op, cause) (stallwatch_probe_blocked_cause{instance=~"$instance",target=~"$target"})',
              legendFormat: '{{target}} {{mode}}/{{op}}: {{cause}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              custom: {
                drawStyle: 'line',
                lineWidth: 2,
                fillOpacity: 30,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        // ---- row: Kernel writeback
        {
          type: 'row',
          id: 20,
          title: 'Kernel writeback',
          collapsed: false,
          gridPos: {
            h: 1,
            w: 24,
            x: 0,
            y: 71,
          },
          panels: [],
        },
        {
          type: 'timeseries',
          id: 21,
          title: 'Dirty and writeback vs thresholds',
          description: "Page-cache memory waiting to be written (stallwatch_vm_dirty_bytes) and being written (stallwatch_vm_writeback_bytes), against the kernel's background threshold (writeback starts) and dirty threshold (every writer is throttled in balance_dirty_pages), per host.",
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 72,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} dirty',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_writeback_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} writeback',
              refId: 'B',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_threshold_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} dirty threshold',
              refId: 'C',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_background_threshold_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} background threshold',
              refId: 'D',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'bytes',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [
              {
                matcher: {
                  id: 'byRegexp',
                  options: '.*threshold$',
                },
                properties: [
                  {
                    id: 'custom.lineStyle',
                    value: {
                      fill: 'dash',
                      dash: [
                        10,
                        10,
                      ],
                    },
                  },
                  {
                    id: 'custom.fillOpacity',
                    value: 0,
                  },
                ],
              },
            ],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 22,
          title: 'Dirty as a fraction of the thresholds',
          description: '(dirty + writeback) / dirty threshold -- what the kernel compares before throttling writers -- and dirty / background threshold. At 1.0 of the dirty threshold writes block; the alert StallwatchDirtyNearThreshold fires above 0.8 for 2 minutes.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 72,
          },
          targets: [
            {
              datasource: ds,
              expr: '(stallwatch_vm_dirty_bytes{instance=~"$instance"} + stallwatch_vm_writeback_bytes{instance=~"$instance"}) / stallwatch_vm_dirty_threshold_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} of dirty threshold',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_bytes{instance=~"$instance"} / stallwatch_vm_dirty_background_threshold_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} of background threshold',
              refId: 'B',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'percentunit',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
                thresholdsStyle: {
                  mode: 'dashed',
                },
              },
              color: {
                mode: 'palette-classic',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'transparent',
                    value: null,
                  },
                  {
                    color: 'orange',
                    value: 0.8,
                  },
                  {
                    color: 'red',
                    value: 1,
                  },
                ],
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 23,
          title: 'Dirtied vs written',
          description: 'Bytes per second the host dirties in the page cache (stallwatch_vm_dirtied_bytes_total) and writes back (stallwatch_vm_written_bytes_total). Dirtied above written for long fills the cache up to the dirty threshold.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 80,
          },
          targets: [
            {
              datasource: ds,
              expr: 'rate(stallwatch_vm_dirtied_bytes_total{instance=~"$instance"}[$__rate_interval])',
              legendFormat: '{{instance}} dirtied',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'rate(stallwatch_vm_written_bytes_total{instance=~"$instance"}[$__rate_interval])',
              legendFormat: '{{instance}} written',
              refId: 'B',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'Bps',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 24,
          title: 'IO pressure',
          description: 'Share of wall time in which some (at least one) or all non-idle tasks were stalled on I/O, from /proc/pressure/io (rate of stallwatch_pressure_io_some/full_seconds_total). Empty on kernels without PSI.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 80,
          },
          targets: [
            {
              datasource: ds,
              expr: 'rate(stallwatch_pressure_io_some_seconds_total{instance=~"$instance"}[$__rate_interval])',
              legendFormat: '{{instance}} some',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'rate(stallwatch_pressure_io_full_seconds_total{instance=~"$instance"}[$__rate_interval])',
              legendFormat: '{{instance}} full',
              refId: 'B',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'percentunit',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'table',
          id: 25,
          title: 'vm.dirty_* settings',
          description: "The host's writeback sysctls in base units: dirty_ratio and dirty_background_ratio as fractions of dirtyable memory (0 when the *_bytes setting is used instead), dirty_bytes and dirty_background_bytes (0 when the ratio is used), dirty_expire and dirty_writeback in seconds.",
          datasource: ds,
          gridPos: {
            h: 6,
            w: 24,
            x: 0,
            y: 88,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_ratio{instance=~"$instance"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'A',
              legendFormat: '',
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_background_ratio{instance=~"$instance"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'B',
              legendFormat: '',
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_bytes_setting{instance=~"$instance"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'C',
              legendFormat: '',
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_background_bytes_setting{instance=~"$instance"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'D',
              legendFormat: '',
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_expire_seconds{instance=~"$instance"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'E',
              legendFormat: '',
            },
            {
              datasource: ds,
              expr: 'stallwatch_vm_dirty_writeback_seconds{instance=~"$instance"}',
              format: 'table',
              instant: true,
              range: false,
              refId: 'F',
              legendFormat: '',
            },
          ],
          transformations: [
            {
              id: 'merge',
              options: {},
            },
            {
              id: 'organize',
              options: {
                excludeByName: {
                  Time: true,
                  job: true,
                },
                renameByName: {
                  'Value #A': 'dirty_ratio',
                  'Value #B': 'dirty_background_ratio',
                  'Value #C': 'dirty_bytes',
                  'Value #D': 'dirty_background_bytes',
                  'Value #E': 'dirty_expire',
                  'Value #F': 'dirty_writeback',
                },
              },
            },
          ],
          fieldConfig: {
            defaults: {
              custom: {
                align: 'auto',
              },
              unit: 'none',
            },
            overrides: [
              {
                matcher: {
                  id: 'byRegexp',
                  options: '.*_ratio',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 'percentunit',
                  },
                ],
              },
              {
                matcher: {
                  id: 'byRegexp',
                  options: 'dirty(_background)?_bytes',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 'bytes',
                  },
                ],
              },
              {
                matcher: {
                  id: 'byRegexp',
                  options: 'dirty_(expire|writeback)',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 's',
                  },
                ],
              },
            ],
          },
          options: {
            showHeader: true,
          },
        },

        // ---- row: RAID and devices
        {
          type: 'row',
          id: 26,
          title: 'RAID and devices',
          collapsed: false,
          gridPos: {
            h: 1,
            w: 24,
            x: 0,
            y: 94,
          },
          panels: [],
        },
        {
          type: 'state-timeline',
          id: 27,
          title: 'md sync action',
          description: 'What each md RAID array under a probed target is doing (stallwatch_md_sync_action, 1 for the current action): idle, check, repair, resync, recover, reshape, frozen. A check or resync competes with the applications for the disks and often lines up with latency peaks. Empty when no target lives on md.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 95,
          },
          targets: [
            {
              datasource: ds,
              expr: 'max by (instance, device, action) (stallwatch_md_sync_action{instance=~"$instance"} == 1)',
              legendFormat: '{{instance}} {{device}}: {{action}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              color: {
                mode: 'thresholds',
              },
              thresholds: {
                mode: 'absolute',
                steps: [
                  {
                    color: 'transparent',
                    value: null,
                  },
                  {
                    color: 'orange',
                    value: 1,
                  },
                ],
              },
              custom: {
                fillOpacity: 70,
                lineWidth: 0,
              },
              unit: 'none',
            },
            overrides: [],
          },
          options: {
            showValue: 'never',
            mergeValues: true,
            rowHeight: 0.9,
            alignValue: 'left',
            legend: {
              showLegend: false,
              displayMode: 'list',
              placement: 'bottom',
            },
            tooltip: {
              mode: 'single',
            },
          },
        },
        {
          type: 'timeseries',
          id: 28,
          title: 'md sync progress',
          description: 'Progress of the running md check/resync/recovery per array (stallwatch_md_sync_completed_ratio, 0-1). Empty when no target lives on md or no sync runs.',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 95,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_md_sync_completed_ratio{instance=~"$instance"}',
              legendFormat: '{{instance}} {{device}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'percentunit',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 29,
          title: 'Device in-flight requests',
          description: 'Requests queued or being serviced by each backing block device of the targets, by direction (stallwatch_device_inflight_requests). A queue that stays full while latency rises points at the device or controller; an empty queue with high latency points above it (journal, locks, dirty throttling).',
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 0,
            y: 103,
          },
          targets: [
            {
              datasource: ds,
              expr: 'stallwatch_device_inflight_requests{instance=~"$instance"}',
              legendFormat: '{{instance}} {{device}} {{direction}}',
              refId: 'A',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'none',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
        {
          type: 'timeseries',
          id: 30,
          title: 'Agent process',
          description: "The agent's own resident memory and CPU (process_* metrics), whether Prometheus can scrape it (up), and failed samples of /proc/vmstat, PSI or the vm sysctls (stallwatch_vm_sample_errors_total). The unit caps memory with MemoryMax=128M.",
          datasource: ds,
          gridPos: {
            h: 8,
            w: 12,
            x: 12,
            y: 103,
          },
          targets: [
            {
              datasource: ds,
              expr: 'process_resident_memory_bytes{instance=~"$instance"}',
              legendFormat: '{{instance}} resident memory',
              refId: 'A',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'rate(process_cpu_seconds_total{instance=~"$instance"}[$__rate_interval])',
              legendFormat: '{{instance}} cpu',
              refId: 'B',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'up{instance=~"$instance"}',
              legendFormat: '{{instance}} up',
              refId: 'C',
              range: true,
              instant: false,
            },
            {
              datasource: ds,
              expr: 'increase(stallwatch_vm_sample_errors_total{instance=~"$instance"}[$__rate_interval])',
              legendFormat: '{{instance}} vm sample errors',
              refId: 'D',
              range: true,
              instant: false,
            },
          ],
          fieldConfig: {
            defaults: {
              unit: 'bytes',
              custom: {
                drawStyle: 'line',
                lineWidth: 1,
                fillOpacity: 10,
                showPoints: 'never',
                spanNulls: false,
                axisSoftMin: 0,
              },
              color: {
                mode: 'palette-classic',
              },
            },
            overrides: [
              {
                matcher: {
                  id: 'byRegexp',
                  options: '.* cpu$',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 'percentunit',
                  },
                  {
                    id: 'custom.axisPlacement',
                    value: 'right',
                  },
                ],
              },
              {
                matcher: {
                  id: 'byRegexp',
                  options: '.* (up|vm sample errors)$',
                },
                properties: [
                  {
                    id: 'unit',
                    value: 'none',
                  },
                  {
                    id: 'custom.axisPlacement',
                    value: 'right',
                  },
                ],
              },
            ],
          },
          options: {
            legend: {
              displayMode: 'table',
              placement: 'bottom',
              showLegend: true,
              calcs: [
                'lastNotNull',
                'max',
              ],
            },
            tooltip: {
              mode: 'multi',
              sort: 'desc',
            },
          },
        },
      ],
    },
  },
}
