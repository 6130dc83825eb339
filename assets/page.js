// stallwatch live page: polls /api/history?view=overview every 1.5 s and draws one row
// per target, trouble first, each a strip per op of the slowest call against the
// threshold with the stalls marked; then, for the target the URL names (#target=NAME;
// every target of a host of one or two), one latency chart per op (log scale, stall
// threshold, stall bands) from its full /api/history; and the kernel's dirty and
// writeback bytes against their thresholds. Served from the binary; no other origin.
// The tables above and below are rendered by the server and stay readable without it.
(function () {
  'use strict';
  if (typeof uPlot === 'undefined') return;

  var POLL_MS = 1500;
  var S = {
    range: 300,
    step: 1,
    from: null, // the last answer's newest point, to ask only for what is new
    // The targets whose charts are open (all of a host's one or two, else the one the
    // URL names): [{name, path, state, detail, stall_threshold_seconds, in_flight, series: [{mode, op, points}]}]
    targets: [],
    // Every target, as the overview shows it: [{name, ..., in_flight, ops: [{mode, op, points: [[t, level]]}]}]
    overview: [],
    ovFrom: null, // the overview answer's newest second, to ask only for what is new
    stripStep: 30,
    open: null, // the target named by `#target=NAME`
    auto: false, // one or two targets: every target's charts
    detailOf: null, // whose series S.targets holds: a name, or '*' for all
    firstRender: 0, // performance.now() when the overview was first drawn
    kernel: [],
    stalls: {}, // key -> event
    stallsVersion: null, // the stall log's version in the last answer
    now: 0, // agent's Unix seconds at the last answer
    fetchedAt: 0, // performance.now() at the last answer
    charts: {}, // "target|mode|op" -> uPlot, and "kernel", "psi"
    layout: '',
    polls: 0,
    error: null,
  };
  window.stallwatch = S;

  // ---- units -------------------------------------------------------------------------
  function fmtDur(s) {
    if (s == null || !isFinite(s)) return '–';
    if (s === 0) return '0 s';
    if (s < 0.001) return +(s * 1e6).toPrecision(3) + ' µs';
    if (s < 1) return +(s * 1e3).toPrecision(3) + ' ms';
    if (s < 60) return +s.toPrecision(3) + ' s';
    var m = Math.floor(s / 60);
    return m + ' min ' + Math.floor(s - m * 60) + ' s';
  }
  // Axis labels: short, never minutes (a label must fit 58 px).
  function fmtAxis(s) {
    if (s < 0.001) return +(s * 1e6).toPrecision(3) + ' µs';
    if (s < 1) return +(s * 1e3).toPrecision(3) + ' ms';
    return +s.toPrecision(3) + ' s';
  }
  function fmtAge(s) {
    if (s < 60) return s.toFixed(1) + ' s';
    var m = Math.floor(s / 60);
    return m + ' min ' + (s - m * 60).toFixed(0) + ' s';
  }
  function fmtBytes(b) {
    if (b == null || !isFinite(b)) return '–';
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    var i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) {
      b /= 1024;
      i++;
    }
    return (i === 0 ? b.toFixed(0) : +b.toPrecision(3)) + ' ' + u[i];
  }
  function fmtPct(r) {
    return r == null || !isFinite(r) ? '–' : (r * 100).toFixed(1) + ' %';
  }
  function fmtTime(t) {
    var d = new Date(t * 1000);
    function p(n) { return (n < 10 ? '0' : '') + n; }
    return p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function nowAgent() {
    return S.now + (performance.now() - S.fetchedAt) / 1000;
  }
  // An event's id is its identity from the crossing to its end (docs/stall-events.md).
  // The event's own page (/stalls/{id}): the whole event written for a person.
  function stallHref(e) {
    return '/stalls/' + encodeURIComponent(e.id);
  }
  function stallKey(e) {
    return e.id || (e.target + '|' + e.mode + '|' + e.op + '|' + e.started_at);
  }
  function unixOf(rfc) {
    return Date.parse(rfc) / 1000;
  }

  // ---- fetching and merging ----------------------------------------------------------
  function merge(old, fresh, from) {
    // Points at or after `from` are replaced (the last step may have grown).
    var keep = old.filter(function (p) { return p[0] < from; });
    return keep.concat(fresh);
  }

  // The answer's columns (docs/http-api.md, "/api/history") as one array per point.
  function us(v) {
    return v == null ? null : v / 1e6;
  }
  // A series: [t, min, p50, max, count] in Unix seconds and seconds. `t` counts from
  // `from`, each point from the one before; a point of one call has no median or min
  // of its own (they are the call).
  function latencyPoints(from, s) {
    var out = [], t = from, j = 0;
    for (var i = 0; i < s.t.length; i++) {
      t += s.t[i];
      var max = us(s.max_us[i]), p50 = max, min = max;
      if (s.count[i] > 1) {
        p50 = us(s.p50_us[j]);
        min = us(s.min_us[j]);
        j++;
      }
      out.push([t, min, p50, max, s.count[i]]);
    }
    return out;
  }
  var KERNEL_COLUMNS = ['dirty_bytes', 'writeback_bytes', 'dirty_background_threshold_bytes',
    'dirty_threshold_bytes', 'io_pressure_some_ratio', 'io_pressure_full_ratio'];
  // The kernel: [t, dirty, writeback, background threshold, threshold, some, full].
  function kernelPoints(from, k) {
    var out = [], t = from;
    for (var i = 0; i < k.t.length; i++) {
      t += k.t[i];
      var p = [t];
      for (var c = 0; c < KERNEL_COLUMNS.length; c++) p.push(k[KERNEL_COLUMNS[c]][i]);
      out.push(p);
    }
    return out;
  }

  // The overview answer (`view=overview`): every target's state, calls in flight and
  // strips, the kernel and the stall events.
  function applyOverview(d, full) {
    S.now = d.now;
    S.fetchedAt = performance.now();
    S.step = d.step;
    S.stripStep = d.strip_step;
    var cut = d.now - S.range - S.step;
    var byName = {};
    S.overview.forEach(function (t) { byName[t.name] = t; });
    S.overview = d.targets.map(function (t, i) {
      var old = full ? null : byName[t.name];
      t.index = i;
      t.ops = t.ops.map(function (o) {
        var fresh = o.worst.map(function (l, k) { return [d.strip_from + k * d.strip_step, l]; });
        var oo = old && old.ops.find(function (x) { return x.mode === o.mode && x.op === o.op; });
        var pts = oo ? merge(oo.points, fresh, d.strip_from) : fresh;
        return { mode: o.mode, op: o.op, points: pts.filter(function (p) { return p[0] + d.strip_step > cut; }) };
      });
      return t;
    });
    var kernel = kernelPoints(d.from, d.kernel);
    S.kernel = (full ? kernel : merge(S.kernel, kernel, d.from)).filter(function (p) { return p[0] >= cut; });
    if (full) S.stalls = {};
    applyStalls(d, cut);
    S.ovFrom = S.kernel.length ? S.kernel[S.kernel.length - 1][0] : d.from;
    // One or two targets: their charts at once; more: the one the URL names.
    S.auto = S.overview.length <= 2;
  }

  // Events: left out when the log has not changed since the stalls_version sent.
  function applyStalls(d, cut) {
    if (d.stalls_version != null) S.stallsVersion = d.stalls_version;
    (d.stalls || []).forEach(function (e) { S.stalls[stallKey(e)] = e; });
    for (var k in S.stalls) {
      var e = S.stalls[k];
      if (!e.ongoing && unixOf(e.started_at) + e.duration_seconds < cut) delete S.stalls[k];
    }
  }

  // The full answer for the targets whose charts are open.
  function applyDetail(d, full) {
    var cut = d.now - S.range - S.step;
    var byName = {};
    S.targets.forEach(function (t) { byName[t.name] = t; });
    S.targets = d.targets.map(function (t) {
      var old = full ? null : byName[t.name];
      t.series = t.series.map(function (s) {
        var fresh = latencyPoints(d.from, s);
        var os = old && old.series.find(function (x) { return x.mode === s.mode && x.op === s.op; });
        var pts = os ? merge(os.points, fresh, d.from) : fresh;
        return { mode: s.mode, op: s.op, points: pts.filter(function (p) { return p[0] >= cut; }) };
      });
      return t;
    });
    applyStalls(d, cut);
    var newest = d.from;
    S.targets.forEach(function (t) {
      t.series.forEach(function (s) {
        if (s.points.length) newest = Math.max(newest, s.points[s.points.length - 1][0]);
      });
    });
    S.from = newest;
  }

  // The target named by the URL (`#target=NAME`), or null.
  function hashTarget() {
    var m = /^#target=(.*)$/.exec(location.hash);
    if (!m) return null;
    try {
      return decodeURIComponent(m[1]);
    } catch (e) {
      return null;
    }
  }

  var timer = null;
  var inFlightFetch = false;
  var wantFull = false;
  function getJson(path) {
    // From the origin, not the document's URL: that may carry user:password@, which
    // fetch refuses; the browser sends the credentials it holds for the origin.
    return fetch(location.origin + path, { credentials: 'same-origin', cache: 'no-store' }).then(function (r) {
      if (!r.ok) throw new Error('HTTP ' + r.status);
      return r.json();
    });
  }
  function poll(full) {
    if (timer) clearTimeout(timer);
    timer = null;
    if (inFlightFetch) {
      // A range change during a request: reload in full once it is answered.
      if (full) wantFull = true;
      return;
    }
    inFlightFetch = true;
    wantFull = false;
    var range = S.range;
    var q = '/api/history?view=overview&range=' + S.range;
    if (!full && S.ovFrom != null) {
      q += '&since=' + S.ovFrom;
      if (S.stallsVersion != null) q += '&stalls_version=' + S.stallsVersion;
    }
    getJson(q)
      .then(function (d) {
        // An answer for the range shown before a change is dropped.
        if (range !== S.range || wantFull) return null;
        applyOverview(d, full);
        renderOverview();
        if (!S.firstRender) {
          S.firstRender = performance.now();
          performance.mark('stallwatch-first-render');
        }
        // The charts of one target (or of all of a host's one or two).
        var open = S.auto ? null : S.open;
        if (!S.auto && open == null) {
          S.targets = [];
          return null;
        }
        var want = S.auto ? '*' : open;
        var again = full || S.detailOf !== want || S.from == null;
        var dq = '/api/history?range=' + S.range + '&step=' + S.step + '&stalls_version=' + S.stallsVersion;
        if (!S.auto) dq += '&target=' + encodeURIComponent(open);
        if (!again) dq += '&since=' + S.from;
        return getJson(dq).then(function (dd) {
          // Dropped when the range or the open target changed meanwhile.
          if (range !== S.range || wantFull || want !== (S.auto ? '*' : S.open)) return;
          if (again) S.targets = [];
          applyDetail(dd, again);
          S.detailOf = want;
        });
      })
      .then(function () {
        if (range !== S.range || wantFull) return;
        S.error = null;
        S.polls++;
        render();
      })
      .catch(function (e) {
        S.error = String(e);
        updateStatus();
      })
      .then(function () {
        inFlightFetch = false;
        if (wantFull) poll(true);
        else timer = setTimeout(function () { poll(false); }, POLL_MS);
      });
  }

  // ---- the overview: one row per target, trouble first -------------------------------
  // A strip's colour by its level (tenths of a decade of the slowest call against the
  // threshold: 0 = at the threshold, -10 = a tenth of it).
  function levelColor(l) {
    if (l == null) return '#eeeeee';
    if (l >= 0) return '#c62828';
    if (l >= -3) return '#ef6c00';
    if (l >= -10) return '#f9c22e';
    if (l >= -20) return '#a5d6a7';
    return '#d7ecd8';
  }
  function blockedCalls(t) {
    var since = (performance.now() - S.fetchedAt) / 1000;
    return t.in_flight.filter(function (c) { return c.age_seconds + since >= t.stall_threshold_seconds; });
  }
  // Why a target is where it is: [blocked now, stalls in the range, errors, worst level].
  function trouble(t) {
    var stalls = 0, errors = t.state !== 'up' && t.state !== 'starting' ? 1 : 0;
    for (var k in S.stalls) {
      var e = S.stalls[k];
      if (e.target !== t.name) continue;
      stalls++;
      if (e.error) errors++;
    }
    var worst = -99;
    t.ops.forEach(function (o) {
      o.points.forEach(function (p) { if (p[1] != null && p[1] > worst) worst = p[1]; });
    });
    return { blocked: blockedCalls(t).length, stalls: stalls, errors: errors, worst: worst };
  }
  function columns() {
    var cols = [], seen = {};
    S.overview.forEach(function (t) {
      t.ops.forEach(function (o) {
        var k = o.mode + '|' + o.op;
        if (!seen[k]) {
          seen[k] = true;
          cols.push(k);
        }
      });
    });
    return cols;
  }
  var STRIP_GAP = 8;
  function stripGeometry(canvas, ncols) {
    var w = canvas.clientWidth || 600;
    var cw = (w - STRIP_GAP * (ncols - 1)) / Math.max(1, ncols);
    return { w: w, cw: cw };
  }

  function renderOverview() {
    var sec = document.getElementById('overview');
    sec.hidden = false;
    var tt = document.getElementById('target-table');
    if (tt && S.overview.length > 2 && !S.tableClosed) {
      tt.open = false;
      S.tableClosed = true;
    }
    var cols = columns();
    var rows = document.getElementById('ov-rows');
    var key = cols.join(',') + ';' + S.overview.map(function (t) { return t.name; }).join('\u0000');
    if (S.ovLayout !== key) {
      S.ovLayout = key;
      rows.textContent = '';
      var head = document.getElementById('ov-cols');
      head.textContent = '';
      cols.forEach(function (c) {
        head.appendChild(el('span', { title: c.replace('|', ' ') }, c.replace('|', ' · ')));
      });
      S.overview.forEach(function (t) {
        var r = el('div', { class: 'ov-row', 'data-target': t.name, title: t.path });
        var a = el('a', { class: 'ov-name', href: '#target=' + encodeURIComponent(t.name) }, t.name);
        r.appendChild(a);
        r.appendChild(el('span', { class: 'ov-state' }));
        r.appendChild(el('a', { class: 'ov-stalls', href: '/stalls?target=' + encodeURIComponent(t.name) }));
        r.appendChild(el('span', { class: 'ov-worst' }));
        var c = el('canvas', { class: 'ov-strips' });
        r.appendChild(c);
        c.addEventListener('mousemove', stripTip.bind(null, t.name));
        c.addEventListener('click', function (ev) {
          ev.stopPropagation();
          var hit = stripAt(t.name, ev);
          if (hit && hit.stall) location.href = '/stalls?target=' + encodeURIComponent(t.name);
          else location.hash = 'target=' + encodeURIComponent(t.name);
        });
        rows.appendChild(r);
      });
    }
    // Trouble first; among equals, the configuration's order.
    var keyed = S.overview.map(function (t) { return { t: t, k: trouble(t) }; });
    keyed.sort(function (a, b) {
      return b.k.blocked - a.k.blocked || b.k.stalls - a.k.stalls || b.k.errors - a.k.errors ||
        b.k.worst - a.k.worst || a.t.index - b.t.index;
    });
    var open = S.auto ? null : S.open;
    keyed.forEach(function (x, i) {
      var t = x.t, k = x.k;
      var r = rows.querySelector('.ov-row[data-target="' + CSS.escape(t.name) + '"]');
      if (rows.children[i] !== r) rows.insertBefore(r, rows.children[i] || null);
      r.className = 'ov-row' + (k.blocked ? ' blocked' : k.stalls || k.errors ? ' troubled' : '') + (open === t.name ? ' open' : '');
      var st = r.querySelector('.ov-state');
      st.textContent = k.blocked ? 'BLOCKED' : t.state;
      st.className = 'ov-state ' + (t.state === 'up' && !k.blocked ? 'up' : 'bad');
      r.querySelector('.ov-stalls').textContent = k.stalls ? k.stalls + (k.stalls > 1 ? ' stalls' : ' stall') : '';
      var w = r.querySelector('.ov-worst');
      var bl = blockedCalls(t);
      var age = bl.reduce(function (m, c) { return Math.max(m, c.age_seconds + (performance.now() - S.fetchedAt) / 1000); }, 0);
      w.textContent = bl.length ? 'blocked ' + (age < 60 ? age.toFixed(1) : age.toFixed(0)) + ' s' : k.worst > -99 ? (k.worst >= 0 ? '≥ ' : '< ') + fmtDur(t.stall_threshold_seconds * Math.pow(10, (k.worst + (k.worst >= 0 ? 0 : 1)) / 10)) : '–';
      w.title = 'the slowest call in the range, against the threshold of ' + fmtDur(t.stall_threshold_seconds);
      drawStrips(r.querySelector('canvas'), t, cols);
    });
  }

  function drawStrips(c, t, cols) {
    var g = stripGeometry(c, cols.length);
    var dpr = window.devicePixelRatio || 1;
    var h = c.clientHeight || 10;
    if (c.width !== Math.round(g.w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(g.w * dpr);
      c.height = Math.round(h * dpr);
    }
    var ctx = c.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.w, h);
    var n = nowAgent(), t0 = n - S.range;
    var stepW = (S.stripStep / S.range) * g.cw;
    cols.forEach(function (col, i) {
      var x0 = i * (g.cw + STRIP_GAP);
      var o = t.ops.find(function (x) { return x.mode + '|' + x.op === col; });
      if (!o) return;
      ctx.fillStyle = '#f4f4f4';
      ctx.fillRect(x0, 0, g.cw, h);
      o.points.forEach(function (p) {
        var x = x0 + ((p[0] - t0) / S.range) * g.cw;
        var x1 = Math.min(x0 + g.cw, x + stepW);
        x = Math.max(x0, x);
        if (x1 <= x) return;
        ctx.fillStyle = levelColor(p[1]);
        ctx.fillRect(x, 0, Math.max(1, x1 - x), h);
      });
      // Stall marks: a dark bar over the stall's span, to now while it lasts.
      for (var k in S.stalls) {
        var e = S.stalls[k];
        if (e.target !== t.name || e.mode + '|' + e.op !== col) continue;
        var s0 = unixOf(e.started_at), s1 = e.ongoing ? n : s0 + e.duration_seconds;
        if (s1 < t0) continue;
        var a = x0 + Math.max(0, (s0 - t0) / S.range) * g.cw;
        var b = x0 + Math.min(1, (s1 - t0) / S.range) * g.cw;
        ctx.fillStyle = '#c62828';
        ctx.fillRect(a, 0, Math.max(2, b - a), h);
        ctx.fillStyle = '#3b0000';
        ctx.fillRect(a, 0, Math.max(2, b - a), 3);
        ctx.fillRect(a, 0, 2, h);
      }
    });
  }

  // What is under the pointer on a row's strips: the op, the time, the level, a stall.
  function stripAt(name, ev) {
    var t = S.overview.find(function (x) { return x.name === name; });
    if (!t) return null;
    var c = ev.currentTarget, cols = columns();
    var g = stripGeometry(c, cols.length);
    var x = ev.offsetX;
    var i = Math.floor(x / (g.cw + STRIP_GAP));
    var col = cols[i];
    if (!col) return null;
    var at = nowAgent() - S.range + ((x - i * (g.cw + STRIP_GAP)) / g.cw) * S.range;
    var o = t.ops.find(function (y) { return y.mode + '|' + y.op === col; });
    var p = o && o.points.find(function (q) { return q[0] <= at && at < q[0] + S.stripStep; });
    var slack = (3 / g.cw) * S.range;
    var stall = null;
    for (var k in S.stalls) {
      var e = S.stalls[k];
      if (e.target !== name || e.mode + '|' + e.op !== col) continue;
      var s0 = unixOf(e.started_at), s1 = e.ongoing ? nowAgent() : s0 + e.duration_seconds;
      if (at >= s0 - slack && at <= s1 + slack) stall = e;
    }
    return { t: t, col: col, at: at, level: p ? p[1] : null, stall: stall };
  }
  function stripTip(name, ev) {
    var h = stripAt(name, ev);
    if (!h) return;
    var thr = h.t.stall_threshold_seconds;
    var txt = h.t.name + ' ' + h.col.replace('|', ' ') + ' at ' + fmtTime(h.at) + ': ';
    if (h.stall) txt += 'stalled ' + fmtDur(h.stall.duration_seconds) + (h.stall.ongoing ? ' (ongoing)' : '') + ': click for the stalls of ' + h.t.name;
    else if (h.level == null) txt += 'no call returned';
    else txt += 'slowest call ' + (h.level >= 0 ? 'at or over' : 'under') + ' ' + fmtDur(thr * Math.pow(10, (h.level + (h.level >= 0 ? 0 : 1)) / 10)) + ' (threshold ' + fmtDur(thr) + ')';
    ev.currentTarget.title = txt;
  }

  // ---- charts ------------------------------------------------------------------------
  var COLORS = { p50: '#1f6fb2', max: '#d9730d', min: '#7aa6c9' };

  function chartWidth(container) {
    return Math.max(240, Math.floor(container.getBoundingClientRect().width) || 320);
  }

  function xScale() {
    return {
      time: true,
      range: function () {
        var n = nowAgent();
        return [n - S.range, n];
      },
    };
  }

  // A horizontal line at `v` on scale `y`, labelled at its right end.
  // `dash` null: only the label (the line is a series of the chart).
  function hline(u, v, color, label, dash, left) {
    if (v == null || !isFinite(v)) return;
    var y = u.valToPos(v, 'y', true);
    if (y < u.bbox.top - 1 || y > u.bbox.top + u.bbox.height + 1) return;
    var c = u.ctx;
    c.save();
    if (dash != null) {
      c.strokeStyle = color;
      c.lineWidth = 1.5 * devicePixelRatio;
      c.setLineDash(dash ? [6 * devicePixelRatio, 4 * devicePixelRatio] : []);
      c.beginPath();
      c.moveTo(u.bbox.left, y);
      c.lineTo(u.bbox.left + u.bbox.width, y);
      c.stroke();
      c.setLineDash([]);
    }
    c.fillStyle = color;
    c.font = 'bold ' + 11 * devicePixelRatio + 'px system-ui, sans-serif';
    c.textAlign = left ? 'left' : 'right';
    c.textBaseline = 'bottom';
    var x = left ? u.bbox.left + 4 * devicePixelRatio : u.bbox.left + u.bbox.width - 4 * devicePixelRatio;
    c.fillText(label, x, y - 2 * devicePixelRatio);
    c.restore();
  }

  // Stall bands: one clickable element per stall of this (target, mode, op), from its
  // start to its end (or now while ongoing), over the plot.
  function placeStalls(u, match) {
    var layer = u.over.querySelector('.stall-layer');
    if (!layer) {
      layer = el('div', { class: 'stall-layer' });
      u.over.appendChild(layer);
    }
    layer.textContent = '';
    var n = nowAgent();
    for (var k in S.stalls) {
      var e = S.stalls[k];
      if (!match(e)) continue;
      var t0 = unixOf(e.started_at);
      var t1 = e.ongoing ? n : t0 + e.duration_seconds;
      if (t1 < n - S.range) continue;
      var x0 = Math.max(0, u.valToPos(t0, 'x'));
      var x1 = Math.min(u.over.clientWidth, u.valToPos(t1, 'x'));
      var b = el('button', {
        class: 'stall-marker' + (e.ongoing ? ' ongoing' : ''),
        'data-key': k,
        title: e.mode + ' ' + e.op + ' stalled ' + fmtDur(e.duration_seconds) + (e.ongoing ? ' (ongoing)' : '') + ' from ' + fmtTime(t0) + ': click for context',
      });
      b.style.left = x0 + 'px';
      b.style.width = Math.max(4, x1 - x0) + 'px';
      b.addEventListener('click', openStall.bind(null, k));
      layer.appendChild(b);
    }
  }

  function latencyChart(box, t, s) {
    var thr = t.stall_threshold_seconds;
    var key = t.name + '|' + s.mode + '|' + s.op;
    var opts = {
      width: chartWidth(box),
      height: 190,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 6 } },
      scales: {
        x: xScale(),
        y: {
          distr: 3,
          log: 10,
          range: function (u, lo, hi) {
            var cur = S.targets.find(function (x) { return x.name === t.name; });
            var th = cur ? cur.stall_threshold_seconds : thr;
            lo = lo == null || !isFinite(lo) ? th / 1000 : Math.min(lo, th);
            hi = hi == null || !isFinite(hi) ? th * 2 : Math.max(hi, th * 1.5);
            // Room for the age of a call of this op blocked right now.
            var c = cur && cur.in_flight.find(function (x) { return x.mode === s.mode && x.op === s.op; });
            if (c) hi = Math.max(hi, c.age_seconds + (performance.now() - S.fetchedAt) / 1000 + 1);
            return uPlot.rangeLog(Math.max(lo / 2, 1e-6), hi * 1.5, 10, true);
          },
        },
      },
      axes: [
        { values: function (u, v) { return v.map(fmtTime); }, space: 70 },
        {
          // Labels on the decades only: 1 µs, 10 µs, ... 10 s.
          values: function (u, v) {
            return v.map(function (x) {
              var l = Math.log10(x);
              return Math.abs(l - Math.round(l)) < 1e-6 ? fmtAxis(x) : '';
            });
          },
          size: 58,
        },
      ],
      series: [
        { value: function (u, v) { return v == null ? '–' : fmtTime(v); } },
        { label: 'max', stroke: COLORS.max, width: 1.5, points: { show: true, size: 4, fill: COLORS.max }, value: function (u, v) { return fmtDur(v); } },
        { label: 'median', stroke: COLORS.p50, width: 1, points: { show: false }, value: function (u, v) { return fmtDur(v); } },
        { label: 'calls', show: false, value: function (u, v) { return v == null ? '–' : v; } },
      ],
      hooks: {
        setCursor: [
          function (u) {
            var out = box.parentNode.querySelector('.readout');
            var i = u.cursor.idx;
            if (i == null || u.data[0][i] == null) {
              out.textContent = '';
              return;
            }
            var n = u.data[3][i];
            out.textContent = fmtTime(u.data[0][i]) + ': ' + (n > 1 ? 'max ' + fmtDur(u.data[1][i]) + ', median ' +
              fmtDur(u.data[2][i]) + ' of ' + n + ' calls' : fmtDur(u.data[1][i]));
          },
        ],
        draw: [
          function (u) {
            var cur = S.targets.find(function (x) { return x.name === t.name; });
            var th = cur ? cur.stall_threshold_seconds : thr;
            hline(u, th, '#c62828', 'stall threshold ' + fmtDur(th), true, true);
            placeStalls(u, function (e) { return e.target === t.name && e.mode === s.mode && e.op === s.op; });
            // A call of this op in the kernel right now past half the threshold: a ring
            // at (now, its age so far), so a stall shows before the call returns.
            var c = cur && cur.in_flight.find(function (x) { return x.mode === s.mode && x.op === s.op; });
            if (c) {
              var age = c.age_seconds + (performance.now() - S.fetchedAt) / 1000;
              if (age >= th / 2) {
                var ctx = u.ctx, r = devicePixelRatio;
                var x = u.valToPos(nowAgent(), 'x', true);
                var y = Math.max(u.bbox.top + 6 * r, u.valToPos(age, 'y', true));
                ctx.save();
                ctx.strokeStyle = '#c62828';
                ctx.lineWidth = 2.5 * r;
                ctx.beginPath();
                ctx.arc(x - 6 * r, y, 5 * r, 0, 2 * Math.PI);
                ctx.stroke();
                ctx.fillStyle = '#c62828';
                ctx.font = 'bold ' + 12 * r + 'px system-ui, sans-serif';
                ctx.textAlign = 'right';
                ctx.textBaseline = 'top';
                ctx.fillText('in flight ' + fmtAge(age), x - 14 * r, y + 4 * r);
                ctx.restore();
              }
            }
          },
        ],
      },
    };
    var u = new uPlot(opts, latencyData(s), box);
    u.root.setAttribute('data-key', key);
    S.charts[key] = u;
    return u;
  }

  function latencyData(s) {
    var x = [], max = [], p50 = [], n = [];
    s.points.forEach(function (p) {
      x.push(p[0]);
      // A 0 cannot be drawn on a log scale; the clock's resolution is far below 1 µs.
      max.push(Math.max(p[3], 1e-7));
      p50.push(Math.max(p[2], 1e-7));
      n.push(p[4]);
    });
    return [x, max, p50, n];
  }

  var MiB = 1024 * 1024;
  function kernelChart(box) {
    var opts = {
      width: chartWidth(box),
      height: 220,
      cursor: { drag: { x: false, y: false } },
      scales: {
        x: xScale(),
        y: {
          range: function (u, lo, hi) {
            var last = S.kernel[S.kernel.length - 1];
            var top = Math.max(hi || 0, last ? last[4] : 0);
            return [0, top * 1.12 || MiB];
          },
        },
      },
      axes: [
        { values: function (u, v) { return v.map(fmtTime); }, space: 70 },
        { values: function (u, v) { return v.map(fmtBytes); }, size: 72 },
      ],
      series: [
        { value: function (u, v) { return v == null ? '–' : fmtTime(v); } },
        { label: 'dirty', stroke: '#d9730d', fill: 'rgba(217,115,13,0.15)', width: 2, value: function (u, v) { return fmtBytes(v); } },
        { label: 'under writeback', stroke: '#6a3fb5', width: 2, value: function (u, v) { return fmtBytes(v); } },
        { label: 'background threshold', stroke: '#2e7d32', width: 2, dash: [8, 4], value: function (u, v) { return fmtBytes(v); } },
        { label: 'throttling threshold', stroke: '#c62828', width: 2, dash: [8, 4], value: function (u, v) { return fmtBytes(v); } },
      ],
      hooks: {
        draw: [
          function (u) {
            var last = S.kernel[S.kernel.length - 1];
            if (!last) return;
            hline(u, last[4], '#c62828', 'throttling threshold: writers throttled above ' + fmtBytes(last[4]), null);
            hline(u, last[3], '#2e7d32', 'background threshold: writeback starts at ' + fmtBytes(last[3]), null);
            placeStalls(u, function () { return true; });
          },
        ],
      },
    };
    var u = new uPlot(opts, kernelData(), box);
    S.charts.kernel = u;
  }

  function kernelData() {
    var c = [[], [], [], [], []];
    S.kernel.forEach(function (p) {
      for (var i = 0; i < 5; i++) c[i].push(p[i]);
    });
    return c;
  }

  function psiChart(box) {
    var opts = {
      width: chartWidth(box),
      height: 140,
      cursor: { drag: { x: false, y: false } },
      scales: { x: xScale(), y: { range: function (u, lo, hi) { return [0, Math.max(0.05, (hi || 0) * 1.2)]; } } },
      axes: [
        { values: function (u, v) { return v.map(fmtTime); }, space: 70 },
        { values: function (u, v) { return v.map(function (x) { return (x * 100).toFixed(0) + ' %'; }); }, size: 72 },
      ],
      series: [
        { value: function (u, v) { return v == null ? '–' : fmtTime(v); } },
        { label: 'some task stalled on I/O', stroke: '#b26a00', width: 1.5, value: function (u, v) { return fmtPct(v); } },
        { label: 'all tasks stalled on I/O', stroke: '#c62828', width: 1.5, value: function (u, v) { return fmtPct(v); } },
      ],
    };
    S.charts.psi = new uPlot(opts, psiData(), box);
  }

  function psiData() {
    var c = [[], [], []];
    S.kernel.forEach(function (p) {
      c[0].push(p[0]);
      c[1].push(p[5]);
      c[2].push(p[6]);
    });
    return c;
  }

  // ---- rendering ---------------------------------------------------------------------
  function layoutKey() {
    // Never '' (what a reset sets), so the kernel charts are built without any target's.
    return 'k;' + S.targets.map(function (t) {
      return t.name + ':' + t.series.map(function (s) { return s.mode + '/' + s.op; }).join(',');
    }).join(';');
  }

  function build() {
    for (var k in S.charts) S.charts[k].destroy();
    S.charts = {};
    var root = document.getElementById('charts');
    root.textContent = '';
    S.targets.forEach(function (t) {
      var sec = el('section', { class: 'target', 'data-target': t.name });
      var h = el('h3');
      h.appendChild(el('span', { class: 'name' }, t.name));
      h.appendChild(el('span', { class: 'path' }, t.path));
      h.appendChild(el('span', { class: 'state' }));
      h.appendChild(el('a', { href: '/stalls?target=' + encodeURIComponent(t.name) }, 'stalls'));
      if (!S.auto) h.appendChild(el('a', { class: 'close', href: '#' }, 'close'));
      sec.appendChild(h);
      sec.appendChild(el('div', { class: 'blocked-now' }));
      var grid = el('div', { class: 'grid' });
      sec.appendChild(grid);
      root.appendChild(sec);
      t.series.forEach(function (s) {
        var card = el('div', { class: 'card' });
        var title = el('div', { class: 'card-title' }, s.mode + ' · ' + s.op);
        title.appendChild(el('span', { class: 'readout' }));
        card.appendChild(title);
        var box = el('div', { class: 'chart' });
        card.appendChild(box);
        grid.appendChild(card);
        latencyChart(box, t, s);
      });
    });
    kernelChart(document.getElementById('kernel-chart'));
    psiChart(document.getElementById('psi-chart'));
    S.layout = layoutKey();
  }

  function render() {
    document.getElementById('controls').hidden = false;
    document.getElementById('latency').hidden = false;
    document.getElementById('kernel').hidden = false;
    var pick = document.getElementById('pick');
    pick.hidden = S.auto || S.targets.length > 0;
    var built = false;
    if (layoutKey() !== S.layout) {
      build();
      built = true;
    }
    if (built && S.scrollTo && S.targets.length) {
      S.scrollTo = false;
      document.getElementById('latency').scrollIntoView();
    }
    S.targets.forEach(function (t) {
      var sec = document.querySelector('section.target[data-target="' + CSS.escape(t.name) + '"]');
      var st = sec.querySelector('.state');
      st.textContent = t.state + (t.detail ? ': ' + t.detail : '');
      st.className = 'state ' + (t.state === 'up' ? 'up' : 'bad');
      t.series.forEach(function (s) {
        var u = S.charts[t.name + '|' + s.mode + '|' + s.op];
        if (u) u.setData(latencyData(s));
      });
    });
    S.charts.kernel.setData(kernelData());
    S.charts.psi.setData(psiData());
    var last = S.kernel[S.kernel.length - 1];
    var kn = document.getElementById('kernel-now');
    if (kn && last) {
      kn.textContent = 'Now: dirty ' + fmtBytes(last[1]) + ' (' + fmtPct(last[4] ? last[1] / last[4] : NaN) +
        ' of the ' + fmtBytes(last[4]) + ' throttling threshold; background writeback from ' +
        fmtBytes(last[3]) + '), under writeback ' + fmtBytes(last[2]) +
        '; I/O pressure some ' + fmtPct(last[5]) + ', full ' + fmtPct(last[6]) + '.';
    }
    renderStalls();
    var dlg = document.getElementById('stall-dialog');
    if (dlg.open && S.stalls[dlg.getAttribute('data-key')]) openStall(dlg.getAttribute('data-key'));
    tick();
  }

  // The blocked calls, counting up between two answers: every 100 ms.
  function tick() {
    var since = (performance.now() - S.fetchedAt) / 1000;
    var alerts = [];
    function callsOf(t) {
      return t.in_flight.map(function (c) {
        return { mode: c.mode, op: c.op, age: c.age_seconds + since };
      });
    }
    S.targets.forEach(function (t) {
      var thr = t.stall_threshold_seconds;
      var shown = callsOf(t).filter(function (c) { return c.age >= Math.min(0.1, thr); });
      var sec = document.querySelector('section.target[data-target="' + CSS.escape(t.name) + '"] .blocked-now');
      if (sec) {
        sec.textContent = '';
        shown.forEach(function (c) {
          var over = c.age >= thr;
          var span = el('span', { class: 'blocked-age' + (over ? ' over' : ''), 'data-op': c.mode + '/' + c.op },
            (over ? 'BLOCKED ' : 'in the kernel ') + c.mode + ' ' + c.op + ' for ' + fmtAge(c.age));
          sec.appendChild(span);
        });
      }
    });
    // Every target's blocked calls: the server's table cells and one banner line each.
    S.overview.forEach(function (t) {
      var thr = t.stall_threshold_seconds;
      var calls = callsOf(t);
      var cell = document.querySelector('td.inflight[data-target="' + CSS.escape(t.name) + '"]');
      if (cell) {
        cell.textContent = calls.length ? calls.map(function (c) {
          return c.mode + ' ' + c.op + ' for ' + c.age.toFixed(1) + ' s';
        }).join(', ') : '-';
      }
      var over = calls.filter(function (c) { return c.age >= thr; });
      if (over.length) {
        alerts.push({ name: t.name, text: t.name + ': ' + over.map(function (c) {
          return c.mode + ' ' + c.op + ' blocked for ' + fmtAge(c.age);
        }).join(', ') + ' (threshold ' + fmtDur(thr) + ')' });
      }
    });
    var b = document.getElementById('blocked');
    b.textContent = '';
    alerts.forEach(function (a) {
      var line = el('a', { class: 'blocked-age over', href: '#target=' + encodeURIComponent(a.name) }, a.text);
      b.appendChild(line);
    });
    updateStatus();
  }

  function updateStatus() {
    var u = document.getElementById('updated');
    if (!u) return;
    if (S.error) {
      u.textContent = 'not updating: ' + S.error;
      u.className = 'bad';
    } else if (S.fetchedAt) {
      var ago = (performance.now() - S.fetchedAt) / 1000;
      u.textContent = 'live · agent time ' + fmtTime(nowAgent()) + ' · updated ' + ago.toFixed(0) + ' s ago';
      u.className = ago > 10 ? 'bad' : '';
    }
  }

  // A field of unknown shape in one table cell: a string as it is, an object by its
  // first string field, else as JSON.
  function brief(v) {
    if (v == null) return '';
    if (typeof v !== 'object') return String(v);
    for (var k in v) if (typeof v[k] === 'string') return v[k];
    return JSON.stringify(v);
  }

  function renderStalls() {
    var box = document.getElementById('stalls');
    var evs = Object.keys(S.stalls).map(function (k) { return S.stalls[k]; });
    evs.sort(function (a, b) { return unixOf(b.started_at) - unixOf(a.started_at); });
    box.textContent = '';
    if (!evs.length) {
      box.appendChild(el('p', null, 'None in the last ' + (S.range >= 3600 ? 'hour' : S.range / 60 + ' minutes') + '.'));
      return;
    }
    // Fields some agents add (cause, verdict) get a column when any event has them.
    var extra = ['cause', 'verdict'].filter(function (k) {
      return evs.some(function (e) { return e[k] != null; });
    });
    var tb = el('table', { class: 'stalls' });
    var hr = el('tr');
    ['started', 'target', 'op', 'duration'].concat(extra, ['also blocked', 'dirty max', 'writeback max', 'error', 'details']).forEach(function (h) {
      hr.appendChild(el('th', null, h));
    });
    tb.appendChild(hr);
    evs.forEach(function (e) {
      var tr = el('tr', { class: e.ongoing ? 'ongoing' : '' });
      var also = (e.also_blocked || []).map(function (a) { return a.mode + ' ' + a.op + ' (' + fmtDur(a.blocked_seconds) + ')'; }).join(', ') || 'none';
      [
        fmtTime(unixOf(e.started_at)),
        e.target,
        e.mode + ' ' + e.op,
        fmtDur(e.duration_seconds) + (e.ongoing ? ' (ongoing)' : ''),
      ].concat(extra.map(function (k) { return brief(e[k]); }), [
        also,
        fmtBytes(e.vm && e.vm.dirty_bytes_max),
        fmtBytes(e.vm && e.vm.writeback_bytes_max),
        e.error || '',
      ]).forEach(function (v) { tr.appendChild(el('td', null, v)); });
      var td = el('td');
      var btn = el('button', { class: 'open-stall' }, 'context');
      btn.addEventListener('click', openStall.bind(null, stallKey(e)));
      td.appendChild(btn);
      if (e.id) {
        td.appendChild(document.createTextNode(' '));
        td.appendChild(el('a', { class: 'stall-link', href: stallHref(e) }, 'page'));
      }
      tr.appendChild(td);
      tb.appendChild(tr);
    });
    box.appendChild(tb);
  }

  // ---- the stall dialog: the known fields first, then every other field as it is ----
  var KNOWN = ['id', 'target', 'mode', 'op', 'started_at', 'duration_seconds', 'ongoing', 'error', 'cause', 'verdict'];
  function fmtField(k, v) {
    if (v == null) return '–';
    if (typeof v === 'number') {
      if (/bytes/.test(k)) return fmtBytes(v) + ' (' + v + ' B)';
      if (/seconds/.test(k)) return fmtDur(v);
      if (/ratio/.test(k)) return fmtPct(v);
    }
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    return String(v);
  }
  function dl(obj) {
    var d = el('dl');
    Object.keys(obj).forEach(function (k) {
      var v = obj[k];
      d.appendChild(el('dt', null, k.replace(/_/g, ' ')));
      var dd = el('dd');
      if (Array.isArray(v)) {
        if (!v.length) dd.textContent = 'none';
        v.forEach(function (x) {
          if (x && typeof x === 'object') dd.appendChild(dl(x));
          else dd.appendChild(el('div', null, fmtField(k, x)));
        });
      } else if (v && typeof v === 'object') {
        dd.appendChild(dl(v));
      } else {
        dd.textContent = fmtField(k, v);
      }
      d.appendChild(dd);
    });
    return d;
  }
  function openStall(key) {
    var e = S.stalls[key];
    if (!e) return;
    var box = document.getElementById('stall-detail');
    box.textContent = '';
    box.appendChild(el('h3', null, 'Stall: ' + e.target + ' ' + e.mode + ' ' + e.op + (e.ongoing ? ' (ongoing)' : '')));
    if (e.id) {
      var p = el('p');
      p.appendChild(el('a', { class: 'stall-link', href: stallHref(e) }, 'Open this stall\'s page'));
      box.appendChild(p);
    }
    var known = {};
    var rest = {};
    Object.keys(e).forEach(function (k) {
      (KNOWN.indexOf(k) >= 0 ? known : rest)[k] = e[k];
    });
    box.appendChild(dl(known));
    box.appendChild(el('h4', null, 'Context'));
    box.appendChild(dl(rest));
    var dlg = document.getElementById('stall-dialog');
    dlg.setAttribute('data-key', key);
    if (!dlg.open) dlg.showModal();
  }

  // For tests and the console: re-render with what is in S.
  S.openStall = openStall;
  S.renderStalls = renderStalls;
  S.renderOverview = renderOverview;

  // ---- controls ----------------------------------------------------------------------
  document.querySelectorAll('input[name=range]').forEach(function (r) {
    r.addEventListener('change', function () {
      S.range = +r.value;
      S.step = S.range <= 300 ? 1 : Math.ceil(S.range / 360);
      S.from = null;
      S.ovFrom = null;
      S.layout = '';
      S.ovLayout = '';
      poll(true);
    });
  });
  // A row (or `#target=NAME` in the URL) opens that target's charts.
  function openFromHash(scroll) {
    var name = hashTarget();
    if (name === S.open) return;
    S.open = name;
    S.scrollTo = scroll && name != null;
    if (!S.auto) {
      S.targets = [];
      S.from = null;
      S.detailOf = null;
      S.layout = '';
      if (S.polls) {
        render();
        renderOverview();
        poll(false);
      }
    }
  }
  window.addEventListener('hashchange', function () { openFromHash(true); });
  document.getElementById('ov-rows').addEventListener('click', function (ev) {
    var r = ev.target.closest('.ov-row');
    if (!r || ev.target.closest('a')) return;
    location.hash = 'target=' + encodeURIComponent(r.getAttribute('data-target'));
  });
  openFromHash(true);
  var resizeTimer = null;
  window.addEventListener('resize', function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { S.layout = ''; render(); renderOverview(); }, 200);
  });
  // The time axis moves with the clock between answers; the ages count up.
  setInterval(function () {
    if (!S.fetchedAt) return;
    tick();
  }, 100);
  setInterval(function () {
    if (!S.fetchedAt) return;
    var n = nowAgent();
    for (var k in S.charts) S.charts[k].setScale('x', { min: n - S.range, max: n });
  }, 1000);
  poll(true);
})();
