// The dashboards that ship, as JSON: `jsonnet -m DIR` (scripts/build-mixin).
{
  ['grafana/' + name]: (import 'mixin.libsonnet').grafanaDashboards[name]
  for name in std.objectFields((import 'mixin.libsonnet').grafanaDashboards)
}
