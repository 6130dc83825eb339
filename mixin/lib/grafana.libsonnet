// Grafana pieces shared by the dashboards.
{
  // Every panel and query reads from the dashboard's `datasource` variable.
  datasource:: { type: 'prometheus', uid: '${datasource}' },

  // The `datasource` template variable itself.
  datasourceVariable(description):: {
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
    description: description,
  },

  // A query variable over `label_values(QUERY, label)`, multi-value with All = '.+'.
  queryVariable(name, label, description, query, current=null):: {
    type: 'query',
    name: name,
    label: label,
    description: description,
    datasource: $.datasource,
    definition: 'label_values(%s)' % query,
    query: { query: 'label_values(%s)' % query, refId: name + '-query', qryType: 1 },
    refresh: 2,
    regex: '',
    sort: 1,
    multi: true,
    includeAll: true,
    current: if current == null then {} else { selected: true, text: [current], value: [current] },
    options: [],
    hide: 0,
    allValue: '.+',
  },

  // One PromQL query of a panel.
  target(expr, legend='', refId='A', instant=false, format=null):: {
    datasource: $.datasource,
    expr: expr,
    legendFormat: legend,
    refId: refId,
    instant: instant,
    range: !instant,
  } + (if format == null then {} else { format: format }),

  row(id, title, y):: {
    type: 'row',
    id: id,
    title: title,
    collapsed: false,
    gridPos: { h: 1, w: 24, x: 0, y: y },
    panels: [],
  },

  // A panel: every one names the datasource variable, a unit and a description.
  panel(type, id, title, description, unit, gridPos, targets):: {
    type: type,
    id: id,
    title: title,
    description: description,
    datasource: $.datasource,
    gridPos: gridPos,
    targets: targets,
    fieldConfig: { defaults: { unit: unit }, overrides: [] },
    options: {},
  },

  stat(id, title, description, unit, gridPos, targets)::
    $.panel('stat', id, title, description, unit, gridPos, targets) + {
      options: {
        reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        colorMode: 'value',
        graphMode: 'area',
        textMode: 'auto',
        justifyMode: 'auto',
        orientation: 'auto',
      },
    },

  timeseries(id, title, description, unit, gridPos, targets)::
    $.panel('timeseries', id, title, description, unit, gridPos, targets) + {
      fieldConfig+: { defaults+: { custom: { drawStyle: 'line', lineWidth: 1, fillOpacity: 0, showPoints: 'never' } } },
      options: {
        legend: { showLegend: true, displayMode: 'table', placement: 'right', calcs: ['max', 'lastNotNull'] },
        tooltip: { mode: 'multi', sort: 'desc' },
      },
    },

  // Horizontal bars of an instant query, largest first: the top-N lists.
  bargauge(id, title, description, unit, gridPos, targets)::
    $.panel('bargauge', id, title, description, unit, gridPos, targets) + {
      options: {
        reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        orientation: 'horizontal',
        displayMode: 'gradient',
        showUnfilled: true,
        minVizHeight: 10,
        minVizWidth: 0,
      },
    },

  table(id, title, description, unit, gridPos, targets)::
    $.panel('table', id, title, description, unit, gridPos, targets) + {
      options: { showHeader: true },
    },
}
