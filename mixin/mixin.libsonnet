// The stallwatch monitoring mixin: alerts, recording rules and Grafana dashboards in the
// layout of the Prometheus monitoring mixins (node-mixin): _config, prometheusAlerts,
// prometheusRules, grafanaDashboards. Override _config to fit a fleet, e.g.
//
//   (import 'stallwatch-mixin/mixin.libsonnet') + {
//     _config+:: { stallwatchSelector: 'job="storage"', fsyncP99Seconds: 1 },
//   }
//
// scripts/build-mixin compiles it to the files that ship (deploy/*.yml, grafana/*.json).
(import 'config.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'rules/rules.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
