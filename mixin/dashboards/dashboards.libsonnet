// The dashboards, by the file name they ship as under grafana/.
(import 'stallwatch.libsonnet') +
(import 'fleet.libsonnet')
