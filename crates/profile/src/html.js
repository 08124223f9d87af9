// Draws the profile page from the embedded data. Plain DOM and SVG, no libraries,
// so the page opens offline. Ends with a self-check that the headless-browser
// test reads: `data-ok` on the body and the messages in the errors box.
(function () {
  'use strict';
  var t0 = performance.now();
  var errors = [];
  var errBox = document.getElementById('errors');
  function fail(m) {
    errors.push(m);
    errBox.textContent = errors.join('\n');
    document.body.setAttribute('data-ok', 'no');
  }
  window.addEventListener('error', function (e) { fail('script error: ' + e.message); });

  var NS = 'http://www.w3.org/2000/svg';
  var D = JSON.parse(document.getElementById('data').textContent);
  var FAULT_ROWS = 1000;
  var COL = { compute: '#4e79a7', exchange: '#f28e2b', host: '#9c755f', sync: '#bab0ac' };
  var CAT = {
    activations: '#4e79a7', weights: '#f28e2b', partials: '#e15759', vertex_state: '#76b7b2',
    code: '#59a14f', exchange_code: '#b07aa1', 'host descriptors': '#9c755f'
  };
  var KIND = { linear: '#4e79a7', attention: '#e15759', layer_norm: '#76b7b2', output: '#59a14f' };

  function svg(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function el(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function tip(e, text) { svg('title', {}, e, text); }
  function fmt(n) { return n === null || n === undefined ? '-' : Number(n).toLocaleString('en-US'); }
  function hex(n) { return '0x' + n.toString(16); }
  function pct(x) { return (100 * x).toFixed(1) + '%'; }
  function catColour(c) { return CAT[c] || '#bab0ac'; }
  function niceStep(range, n) {
    var raw = Math.max(range, 1) / n;
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }

  // Timeline ------------------------------------------------------------------
  // Groups are drawn open up to this many layers; beyond, a reader opens the
  // ones they want, and only those are drawn.
  var LAYERS_OPEN = 2;
  var layerOf = {};
  D.ops.forEach(function (o) { if (o.layer !== null && o.layer !== undefined) layerOf[o.name] = o.layer; });
  // Draws cycles a..b into `host` (the main timeline unless given) as the svg `id`.
  function drawTimeline(a, b, host, id) {
    host = host || document.getElementById('timeline-plot');
    id = id || 'timeline-svg';
    host.textContent = '';
    var dy = D.layers.length ? 28 : 0;
    var W = 1340, L = 110, R = 16, H = 196 + dy;
    var pw = W - L - R, span = Math.max(1, b - a);
    var s = svg('svg', { id: id, 'class': 'timeline', width: W, height: H, viewBox: '0 0 ' + W + ' ' + H }, host);
    function x(c) { return L + pw * (Math.min(Math.max(c, a), b) - a) / span; }
    function bar(y, h, s0, e0, fill, cls, title) {
      if (e0 < a || s0 > b) return null;
      var r = svg('rect', {
        x: x(s0).toFixed(2), y: y, width: Math.max(0.4, x(e0) - x(s0)).toFixed(2), height: h,
        fill: fill, 'class': cls
      }, s);
      if (title) tip(r, title);
      return r;
    }
    var rows = [['supersteps', 27], ['phases', 55], ['operations', 83]];
    if (dy) rows.push(['layers', 111]);
    rows.forEach(function (l) {
      svg('text', { x: L - 8, y: l[1], 'text-anchor': 'end' }, s, l[0]);
    });
    var ss = D.profile.supersteps;
    ss.forEach(function (q, i) {
      bar(12, 22, q.start, q.end, i % 2 ? '#a9bcd8' : '#cbd7ea', 'ss',
        'superstep ' + q.index + ': cycles ' + fmt(q.start) + '..' + fmt(q.end) + '; compute ' +
        fmt(q.compute) + ', exchange ' + fmt(q.exchange) + ', host ' + fmt(q.host) +
        (D.labels[i] ? '; charged to ' + D.labels[i] : ''));
      bar(40, 22, q.start, q.end, COL.compute, 'phase', 'compute in superstep ' + q.index);
      var next = ss[i + 1];
      if (next && next.start > q.end) {
        bar(40, 22, q.end, next.start, COL.sync, 'phase', 'sync after superstep ' + q.index + ': ' + fmt(next.start - q.end) + ' cycles');
      }
    });
    D.phases.forEach(function (p) {
      bar(40, 22, p.start, p.end, COL[p.kind], 'phase', p.kind === 'host'
        ? 'host transfer: ' + fmt(p.end - p.start) + ' cycles, ' + fmt(p.detail) + ' bytes'
        : 'exchange ' + p.detail + ': ' + fmt(p.end - p.start) + ' cycles');
    });
    var kinds = {};
    D.ops.forEach(function (o) { kinds[o.name] = o.kind; });
    D.op_spans.forEach(function (o, i) {
      var r = bar(68, 22, o[1], o[2], KIND[kinds[o[0]]] || '#888', 'op',
        o[0] + ' (' + (kinds[o[0]] || '?') + '): cycles ' + fmt(o[1]) + '..' + fmt(o[2]));
      if (!r) return;
      r.setAttribute('fill-opacity', i % 2 ? '0.6' : '0.95');
      var w = x(o[2]) - x(o[1]);
      if (w > 6.5 * o[0].length + 6) {
        svg('text', { x: x(o[1]) + 3, y: 83, fill: 'white', 'pointer-events': 'none' }, s, o[0]);
      }
    });
    D.layers.forEach(function (l, i) {
      if (l.end <= l.start) return;
      var r = bar(96, 22, l.start, l.end, i % 2 ? '#b04' : '#d46', 'layer',
        'layer ' + l.layer + ': ' + fmt(l.cycles) + ' cycles, cycles ' + fmt(l.start) + '..' + fmt(l.end) + '; click to open it below');
      if (!r) return;
      r.setAttribute('data-layer', l.layer);
      r.addEventListener('click', function () { openLayer(l.layer, true); });
      var label = 'layer ' + l.layer;
      if (x(l.end) - x(l.start) > 6.5 * label.length + 6) {
        svg('text', { x: x(l.start) + 3, y: 111, fill: 'white', 'pointer-events': 'none' }, s, label);
      }
    });
    function bracket(y, s0, e0, colour, label) {
      if (e0 < a || s0 > b) return;
      var x0 = x(s0), x1 = x(e0);
      svg('path', { d: 'M' + x0 + ',' + (y - 6) + 'v6H' + x1 + 'v-6', fill: 'none', stroke: colour, 'stroke-width': 2, 'class': 'mark' }, s);
      var t = svg('text', { x: x0 + 4, y: y - 9, fill: colour, 'font-weight': 600 }, s, label);
      if (x0 + 4 + 6.2 * label.length > W - R) {
        t.setAttribute('x', x1 - 4);
        t.setAttribute('text-anchor', 'end');
      }
    }
    bracket(120 + dy, D.init_cycles, D.total_cycles, '#222', 'cropped span: ' + fmt(D.run_cycles) + ' cycles');
    if (D.encoder) {
      bracket(146 + dy, D.encoder.start, D.encoder.end, '#b04', 'encoder interval: ' + fmt(D.encoder.cycles) + ' cycles');
    }
    var step = niceStep(span, 8);
    svg('line', { x1: L, x2: L + pw, y1: 160 + dy, y2: 160 + dy, stroke: '#888' }, s);
    for (var c = Math.ceil(a / step) * step; c <= b; c += step) {
      svg('line', { x1: x(c), x2: x(c), y1: 160 + dy, y2: 165 + dy, stroke: '#888' }, s);
      svg('text', { x: x(c), y: 178 + dy, 'text-anchor': 'middle' }, s, fmt(c));
    }
    svg('text', { x: L - 8, y: 178 + dy, 'text-anchor': 'end' }, s, 'cycle');
  }

  // Layers: one collapsible group each, its timeline and operations drawn the
  // first time it opens, so that a 27-layer page draws only what is looked at.
  function layerGroup(layer) {
    return document.querySelector('details.layer-group[data-layer="' + layer + '"]');
  }
  function fillLayer(d, l) {
    if (d.getAttribute('data-drawn')) return;
    d.setAttribute('data-drawn', 'yes');
    var body = el('div', { 'class': 'layer-body' }, d);
    var controls = el('div', { 'class': 'controls' }, body);
    var show = el('button', {}, controls, 'show on the timeline above');
    show.addEventListener('click', function () {
      drawTimeline(l.start, l.end);
      document.getElementById('timeline').scrollIntoView();
    });
    drawTimeline(l.start, l.end, el('div', { 'class': 'plot' }, body), 'layer-svg-' + l.layer);
    var t = el('table', { 'class': 'grid layer-ops' }, body);
    var hr = el('tr', {}, el('thead', {}, t));
    ['operation', 'kind', 'cycles', 'compute', 'exchange cycles', '% of the layer', 'FLOP'].forEach(function (h, i) {
      el('th', i < 2 ? { 'class': 'name' } : {}, hr, h);
    });
    var tb = el('tbody', {}, t);
    D.ops.forEach(function (o) {
      if (o.layer !== l.layer) return;
      var tr = el('tr', { 'class': 'layer-op' }, tb);
      el('td', { 'class': 'name' }, tr, o.name);
      el('td', { 'class': 'name' }, tr, o.kind);
      el('td', {}, tr, fmt(o.cycles));
      el('td', {}, tr, fmt(o.compute));
      el('td', {}, tr, fmt(o.exchange));
      el('td', {}, tr, pct(o.cycles / Math.max(1, l.cycles)));
      el('td', {}, tr, fmt(o.flop));
    });
  }
  function drawLayers() {
    var box = document.getElementById('layer-groups');
    if (!D.layers.length) return;
    var open = D.layers.length <= LAYERS_OPEN;
    el('p', {}, box, D.layers.length + (D.layers.length === 1 ? ' encoder layer' : ' encoder layers') +
      (open ? '' : ', collapsed: open one to draw its timeline and operations') + '.');
    D.layers.forEach(function (l) {
      var d = el('details', { 'class': 'layer-group', 'data-layer': l.layer }, box);
      var n = 0;
      D.labels.forEach(function (name) { if (name !== null && layerOf[name] === l.layer) n++; });
      el('summary', {}, d, 'layer ' + l.layer + ': ' + fmt(l.cycles) + ' cycles (' +
        pct(l.cycles / Math.max(1, D.run_cycles)) + ' of the cropped span), cycles ' + fmt(l.start) + '..' +
        fmt(l.end) + ', ' + n + (n === 1 ? ' superstep' : ' supersteps'));
      // Drawn on the click itself, not the later `toggle` event, so that it is
      // there as soon as the group opens.
      d.firstChild.addEventListener('click', function () { fillLayer(d, l); });
      d.addEventListener('toggle', function () { if (d.open) fillLayer(d, l); });
      if (open) {
        d.open = true;
        fillLayer(d, l);
      }
    });
  }
  function openLayer(layer, scroll) {
    var d = layerGroup(layer);
    if (!d) return false;
    if (!d.open) d.firstChild.click();
    if (scroll) d.scrollIntoView();
    return d.open && d.getAttribute('data-drawn') === 'yes';
  }
  var zooms = {
    all: [0, D.total_cycles],
    cropped: [D.init_cycles, D.total_cycles],
    encoder: D.encoder ? [D.encoder.start, D.encoder.end] : null
  };
  document.querySelectorAll('button[data-zoom]').forEach(function (btn) {
    var z = zooms[btn.getAttribute('data-zoom')];
    if (!z) { btn.disabled = true; return; }
    btn.addEventListener('click', function () { drawTimeline(z[0], z[1]); });
  });

  // Operations ----------------------------------------------------------------
  var opCols = [
    ['index', '#'], ['name', 'operation'], ['kind', 'kind'], ['cycles', 'cycles'],
    ['compute', 'compute'], ['exchange', 'exchange cycles'], ['span_share', '% of cropped span'],
    ['flop', 'FLOP'], ['peak_share', '% of f16 peak'], ['exchange_bytes', 'exchange bytes'],
    ['tiles', 'tiles'], ['layer', 'layer']
  ];
  var opRows = D.ops.map(function (o, i) {
    var r = Object.assign({}, o);
    r.index = i;
    r.span_share = o.cycles / Math.max(1, D.run_cycles);
    // Sorting compares numbers: operations outside the layers sort first.
    r.layer = o.layer === null || o.layer === undefined ? -1 : o.layer;
    return r;
  });
  var sortKey = 'index', sortDir = 1;
  function drawOps() {
    var table = document.getElementById('op-table');
    var head = table.tHead.rows[0];
    head.textContent = '';
    opCols.forEach(function (c) {
      var th = el('th', { 'data-key': c[0] }, head, c[1]);
      if (c[0] === 'name' || c[0] === 'kind') th.className = 'name';
      if (c[0] === sortKey) th.className += sortDir > 0 ? ' sorted-asc' : ' sorted-desc';
      th.addEventListener('click', function () {
        if (sortKey === c[0]) sortDir = -sortDir;
        else { sortKey = c[0]; sortDir = typeof opRows[0][c[0]] === 'string' ? 1 : -1; }
        drawOps();
      });
    });
    var rows = opRows.slice().sort(function (p, q) {
      var u = p[sortKey], v = q[sortKey];
      var d = typeof u === 'string' ? u.localeCompare(v) : u - v;
      return sortDir * d || p.index - q.index;
    });
    var body = table.tBodies[0];
    body.textContent = '';
    rows.forEach(function (o) {
      var tr = el('tr', { 'class': 'op' }, body);
      el('td', {}, tr, String(o.index));
      el('td', { 'class': 'name' }, tr, o.name);
      el('td', { 'class': 'name' }, tr, o.kind);
      el('td', {}, tr, fmt(o.cycles));
      el('td', {}, tr, fmt(o.compute));
      el('td', {}, tr, fmt(o.exchange));
      el('td', {}, tr, pct(o.span_share));
      el('td', {}, tr, fmt(o.flop));
      el('td', {}, tr, o.flop && o.cycles ? pct(o.peak_share) : '-');
      el('td', {}, tr, fmt(o.exchange_bytes));
      el('td', {}, tr, fmt(o.tiles));
      el('td', {}, tr, o.layer < 0 ? '-' : String(o.layer));
      tr.addEventListener('click', function () { zoomToOp(o.name); });
    });
  }
  // A row opens the timeline on the supersteps charged to its operation.
  function zoomToOp(name) {
    var spans = D.op_spans.filter(function (s) { return s[0] === name; });
    if (!spans.length) return;
    var a = Math.min.apply(null, spans.map(function (s) { return s[1]; }));
    var b = Math.max.apply(null, spans.map(function (s) { return s[2]; }));
    var pad = Math.max(1, (b - a) / 20);
    drawTimeline(Math.max(0, a - pad), Math.min(D.total_cycles, b + pad));
    document.getElementById('timeline').scrollIntoView();
  }

  // Tiles ---------------------------------------------------------------------
  var faulty = {};
  D.faults.forEach(function (f) { faulty[f.tile] = (faulty[f.tile] || 0) + 1; });
  var sramBytes = D.sram.end - D.sram.start;
  function ramp(lo, hi, t) {
    t = Math.max(0, Math.min(1, t));
    var c = [0, 1, 2].map(function (i) { return Math.round(lo[i] + (hi[i] - lo[i]) * t); });
    return 'rgb(' + c.join(',') + ')';
  }
  function heatmap(parent, title, value, max, lo, hi, describe) {
    var n = D.tiles.length;
    var cols = Math.min(64, Math.max(1, Math.ceil(Math.sqrt(n * 2))));
    var rows = Math.ceil(n / cols);
    var cell = Math.max(9, Math.min(40, Math.floor(620 / cols)));
    var box = el('div', { 'class': 'heatmap' }, parent);
    el('h3', {}, box, title);
    var W = cols * cell + 2, H = rows * cell + 40;
    var s = svg('svg', { width: W, height: H, viewBox: '0 0 ' + W + ' ' + H }, box);
    D.tiles.forEach(function (t, i) {
      var v = value(t);
      var r = svg('rect', {
        x: 1 + (i % cols) * cell, y: 1 + Math.floor(i / cols) * cell, width: cell - 1, height: cell - 1,
        fill: v === null ? '#eee' : ramp(lo, hi, v / Math.max(1, max)), 'class': 'tile', 'data-tile': t.tile
      }, s);
      if (faulty[t.tile]) {
        r.setAttribute('stroke', '#e00');
        r.setAttribute('stroke-width', 2);
      }
      tip(r, 'tile ' + t.tile + ': ' + describe(t) + (faulty[t.tile] ? '; ' + faulty[t.tile] + ' faults' : ''));
    });
    var y = rows * cell + 10;
    var grad = svg('defs', {}, s);
    var gid = 'ramp' + box.parentNode.childNodes.length;
    var lg = svg('linearGradient', { id: gid }, grad);
    svg('stop', { offset: '0', 'stop-color': ramp(lo, hi, 0) }, lg);
    svg('stop', { offset: '1', 'stop-color': ramp(lo, hi, 1) }, lg);
    svg('rect', { x: 1, y: y, width: 120, height: 10, fill: 'url(#' + gid + ')', stroke: '#888' }, s);
    svg('text', { x: 1, y: y + 24 }, s, '0');
    svg('text', { x: 121, y: y + 24, 'text-anchor': 'end' }, s, fmt(max));
    svg('text', { x: 132, y: y + 9 }, s, 'grey: unused');
    s.addEventListener('click', function (e) {
      var t = e.target.getAttribute && e.target.getAttribute('data-tile');
      if (t !== null && t !== undefined) {
        showTile(Number(t));
        document.getElementById('sram').scrollIntoView();
      }
    });
  }
  // Min, median and max over the tiles the plan uses: the spread is the imbalance.
  function spread(values) {
    var v = values.filter(function (x) { return x !== null; }).sort(function (p, q) { return p - q; });
    if (!v.length) return 'no tile used';
    return 'min ' + fmt(v[0]) + ', median ' + fmt(v[v.length >> 1]) + ', max ' + fmt(v[v.length - 1]);
  }
  function drawTiles() {
    var box = document.getElementById('heatmaps');
    var used = D.tiles.filter(function (t) { return t.peak_bytes !== null || t.busy; });
    var maxBusy = Math.max.apply(null, D.tiles.map(function (t) { return t.busy; }).concat([1]));
    heatmap(box, 'busy cycles (' + spread(used.map(function (t) { return t.busy; })) + ')', function (t) {
      return t.peak_bytes === null && !t.busy ? null : t.busy;
    }, maxBusy, [247, 251, 255], [8, 48, 107], function (t) {
      return fmt(t.busy) + ' busy cycles (' + pct(t.busy / Math.max(1, D.run_cycles)) + ' of the cropped span)';
    });
    heatmap(box, 'SRAM high-water mark in bytes (' + spread(used.map(function (t) { return t.peak_bytes; })) +
      '; SRAM ' + fmt(sramBytes) + ')', function (t) {
      return t.peak_bytes;
    }, sramBytes, [255, 245, 235], [127, 39, 4], function (t) {
      return t.peak_bytes === null ? 'unused' : fmt(t.peak_bytes) + ' bytes (' + pct(t.peak_bytes / sramBytes) + ' of SRAM)';
    });
  }

  // SRAM viewer ---------------------------------------------------------------
  var legend = document.getElementById('sram-legend');
  ['activations', 'weights', 'partials', 'code', 'exchange_code', 'vertex_state', 'host descriptors', 'other'].forEach(function (c) {
    el('i', { style: 'background:' + catColour(c) }, legend);
    legend.appendChild(document.createTextNode(c + ' '));
  });
  var layoutUsers = {};
  D.tiles.forEach(function (t) {
    if (t.layout !== null) layoutUsers[t.layout] = (layoutUsers[t.layout] || 0) + 1;
  });
  // A layout's buffers as [name, category, addr, size, first, last, align,
  // class, tail, loaded] (strings as indices), from the tables they are stored in.
  var unpacked = {};
  function layoutBuffers(i) {
    if (unpacked[i]) return unpacked[i];
    var id = 0;
    unpacked[i] = D.packed[i][2].map(function (d) {
      id += d;
      var b = D.buffers.slice(5 * id, 5 * id + 5), k = D.kinds[b[1]];
      return [b[0], k[0], b[2], k[1], b[3], b[3] + b[4], k[2], k[3], k[4], k[5]];
    });
    return unpacked[i];
  }
  // The address window of the viewer: the whole SRAM until the user zooms.
  var view = { tile: 0, lo: D.sram.start, hi: Math.max(D.sram.end, D.sram.start + 1) };
  function showTile(t, lo, hi) {
    if (t !== view.tile || lo === undefined) {
      lo = D.sram.start;
      hi = Math.max(D.sram.end, lo + 1);
    }
    view = { tile: t, lo: lo, hi: hi };
    var input = document.getElementById('tile-input');
    input.value = t;
    var plot = document.getElementById('sram-plot');
    var caption = document.getElementById('sram-caption');
    plot.textContent = '';
    var row = D.tiles[t];
    if (!row) { caption.textContent = 'no tile ' + t + ' (the machine has ' + D.tiles.length + ')'; return; }
    if (row.layout === null) { caption.textContent = 'tile ' + t + ' holds nothing: the plan does not use it.'; return; }
    var lay = D.packed[row.layout];
    var steps = Math.max(1, lay[0]), bufs = layoutBuffers(row.layout), res = lay[3];
    caption.textContent = 'tile ' + t + ': ' + bufs.length + ' buffers, high-water mark ' + fmt(row.peak_bytes) +
      ' bytes (' + pct(row.peak_bytes / sramBytes) + ' of SRAM), ' + fmt(row.busy) + ' busy cycles; layout ' +
      row.layout + ', shared by ' + layoutUsers[row.layout] + ' tile(s)' +
      (faulty[t] ? '; ' + faulty[t] + ' faults' : '') +
      '. Address upwards (' + hex(lo) + '..' + hex(hi) + '), plan step to the right; drag vertically to zoom.';
    var W = 1340, L = 92, R = 130, T = 10, B = 34, H = 700;
    var pw = W - L - R, ph = H - T - B;
    var s = svg('svg', { id: 'sram-svg', width: W, height: H, viewBox: '0 0 ' + W + ' ' + H }, plot);
    function x(step) { return L + pw * step / steps; }
    function y(addr) { return T + ph * (1 - (Math.min(Math.max(addr, lo), hi) - lo) / (hi - lo)); }
    function shown(a, b) { return b > lo && a < hi; }
    D.sram.regions.forEach(function (r, i) {
      if (!shown(r.start, r.end)) return;
      var g = svg('rect', {
        x: L, y: y(r.end), width: pw, height: y(r.start) - y(r.end),
        fill: r.interleaved ? '#eef0fa' : '#f8f8ee', stroke: '#999', 'class': 'region'
      }, s);
      tip(g, 'region ' + i + ': ' + hex(r.start) + '..' + hex(r.end) + (r.interleaved ? ', interleaved' : '') +
        (r.executable ? ', executable' : '') + ', memory elements of ' + fmt(r.element_bytes) + ' bytes');
      var e = Math.max(1, r.element_bytes) * (r.interleaved ? 2 : 1);
      for (var a = r.start + e; a < r.end; a += e) {
        if (a > lo && a < hi) {
          svg('line', { x1: L, x2: L + pw, y1: y(a), y2: y(a), stroke: '#d4d4d4', 'class': 'element' }, s);
        }
      }
      svg('text', { x: L + pw + 6, y: (y(Math.max(r.start, lo)) + y(Math.min(r.end, hi))) / 2 + 4 }, s,
        'region ' + i + (r.interleaved ? ' (interleaved)' : ''));
    });
    var tick = Math.pow(2, Math.ceil(Math.log2(Math.max(16, (hi - lo) / 10))));
    for (var k = Math.ceil(lo / tick) * tick; k <= hi; k += tick) {
      svg('line', { x1: L - 4, x2: L, y1: y(k), y2: y(k), stroke: '#666' }, s);
      svg('text', { x: L - 6, y: y(k) + 4, 'text-anchor': 'end' }, s, hex(k));
    }
    res.forEach(function (q) {
      if (!shown(q[1], q[2])) return;
      var r = svg('rect', {
        x: L, y: y(q[2]) - 1, width: pw, height: Math.max(3, y(q[1]) - y(q[2])), fill: catColour('host descriptors'),
        'fill-opacity': 0.8, 'class': 'reserved'
      }, s);
      tip(r, D.strings[q[0]] + ': ' + hex(q[1]) + '..' + hex(q[2]) + ' (' + fmt(q[2] - q[1]) +
        ' bytes, reserved at every step for host descriptors)');
      svg('text', { x: L + pw + 6, y: y(q[1]) + 14, fill: catColour('host descriptors') }, s, 'host descriptors');
    });
    var ll = D.sram.loader_limit;
    if (ll > lo && ll <= hi) {
      svg('line', { x1: L, x2: L + pw, y1: y(ll), y2: y(ll), stroke: '#000', 'stroke-dasharray': '5 3' }, s);
      svg('text', { x: L + pw + 6, y: y(ll) + 2 }, s, 'loader limit');
    }
    var detail = document.getElementById('sram-detail');
    bufs.forEach(function (b) {
      var name = D.strings[b[0]], cat = D.strings[b[1]], cls = D.strings[b[7]];
      var addr = b[2], size = b[3], first = b[4], last = b[5];
      if (!shown(addr, addr + size)) return;
      var text = name + '\ncategory ' + cat + '; ' + hex(addr) + '..' + hex(addr + size) + ', ' + fmt(size) +
        ' bytes; steps ' + first + '..=' + last + '\ncontract: align ' + b[6] + ', memory class ' + cls +
        ', tail ' + b[8] + ' bytes' + (b[9] ? '; loaded by the loader' : '');
      var rx = x(first), rw = Math.max(0.6, x(last + 1) - rx), ry = y(addr + size), rh = Math.max(0.6, y(addr) - ry);
      var r = svg('rect', {
        x: rx.toFixed(2), y: ry.toFixed(2), width: rw.toFixed(2), height: rh.toFixed(2),
        fill: catColour(cat), stroke: '#333', 'stroke-width': 0.3, 'class': 'buf'
      }, s);
      tip(r, text);
      r.addEventListener('mouseenter', function () { detail.textContent = text; });
      if (rw > 6.5 * name.length + 6 && rh > 13) {
        svg('text', { x: rx + 3, y: ry + Math.min(rh, 26) / 2 + 4, fill: 'white', 'pointer-events': 'none' }, s, name);
      }
    });
    var pa = D.sram.start + row.peak_bytes;
    if (pa > lo && pa < hi) {
      var peak = y(pa);
      svg('line', { x1: L, x2: L + pw, y1: peak, y2: peak, stroke: '#c00', 'stroke-dasharray': '2 2' }, s);
      svg('text', { x: L + pw + 6, y: peak - 3, fill: '#c00' }, s, 'high-water mark');
    }
    var st = Math.max(1, niceStep(steps, 10));
    for (var k2 = 0; k2 <= steps; k2 += st) {
      svg('text', { x: x(k2), y: H - B + 16, 'text-anchor': 'middle' }, s, String(k2));
    }
    svg('text', { x: L + pw, y: H - 4, 'text-anchor': 'end' }, s, 'plan step');
    // Drag vertically to zoom into an address range.
    var band = null, y0 = 0;
    function py(e) { return e.clientY - s.getBoundingClientRect().top; }
    function addrAt(p) { return lo + (1 - (Math.min(Math.max(p, T), T + ph) - T) / ph) * (hi - lo); }
    s.addEventListener('mousedown', function (e) {
      y0 = py(e);
      band = svg('rect', { x: L, y: y0, width: pw, height: 0, fill: '#000', 'fill-opacity': 0.1 }, s);
      e.preventDefault();
    });
    s.addEventListener('mousemove', function (e) {
      if (!band) return;
      var y1 = py(e);
      band.setAttribute('y', Math.min(y0, y1));
      band.setAttribute('height', Math.abs(y1 - y0));
    });
    s.addEventListener('mouseup', function (e) {
      if (!band) return;
      var y1 = py(e);
      s.removeChild(band);
      band = null;
      var a1 = Math.floor(addrAt(Math.max(y0, y1))), b1 = Math.ceil(addrAt(Math.min(y0, y1)));
      if (Math.abs(y1 - y0) > 4 && b1 - a1 >= 16) showTile(t, a1, b1);
    });
  }
  document.getElementById('sram-whole').addEventListener('click', function () { showTile(view.tile); });
  document.getElementById('sram-used').addEventListener('click', function () {
    var row = D.tiles[view.tile];
    if (row && row.peak_bytes !== null) {
      showTile(view.tile, D.sram.start, Math.min(D.sram.end, D.sram.start + Math.ceil(row.peak_bytes * 1.02) + 16));
    }
  });
  function pick(better) {
    var best = null;
    D.tiles.forEach(function (t) { if (t.layout !== null && (best === null || better(t, best))) best = t; });
    return best ? best.tile : 0;
  }
  var peakTile = pick(function (t, b) { return t.peak_bytes > b.peak_bytes; });
  var busyTile = pick(function (t, b) { return t.busy > b.busy; });
  var firstFault = D.faults.length ? D.faults[0].tile : null;
  document.getElementById('tile-show').addEventListener('click', function () {
    showTile(Number(document.getElementById('tile-input').value));
  });
  document.getElementById('tile-input').addEventListener('keydown', function (e) {
    if (e.key === 'Enter') showTile(Number(this.value));
  });
  document.getElementById('tile-peak').addEventListener('click', function () { showTile(peakTile); });
  document.getElementById('tile-busy').addEventListener('click', function () { showTile(busyTile); });
  var ff = document.getElementById('tile-fault');
  if (firstFault === null) ff.disabled = true;
  else ff.addEventListener('click', function () { showTile(firstFault); });

  // Faults --------------------------------------------------------------------
  function drawFaults() {
    var box = document.getElementById('fault-list');
    if (!D.faults.length) {
      el('p', {}, box, 'No faults: the run completed (status ' + D.status + ').');
      return;
    }
    var tiles = Object.keys(faulty).length;
    el('p', {}, box, D.faults.length + ' faults on ' + tiles + ' tiles' +
      (D.faults.length > FAULT_ROWS ? '; the first ' + FAULT_ROWS + ' are listed' : '') + '. Click a row to open its tile.');
    var t = el('table', { 'class': 'grid' }, box);
    var hr = el('tr', {}, el('thead', {}, t));
    ['tile', 'context', 'kind', 'symbol+offset', 'instruction', 'address', 'cycle', 'cause'].forEach(function (h) {
      el('th', { 'class': 'name' }, hr, h);
    });
    var body = el('tbody', {}, t);
    D.faults.slice(0, FAULT_ROWS).forEach(function (f) {
      var tr = el('tr', { 'class': 'fault tile' }, body);
      el('td', {}, tr, String(f.tile));
      el('td', { 'class': 'name' }, tr, f.context);
      el('td', { 'class': 'name' }, tr, f.kind);
      el('td', { 'class': 'name' }, tr, f.symbol ? f.symbol + '+' + hex(f.offset) : hex(f.pc));
      el('td', { 'class': 'name' }, tr, f.instruction);
      el('td', {}, tr, f.address === null ? '-' : hex(f.address));
      el('td', {}, tr, fmt(f.cycle));
      el('td', { 'class': 'name' }, tr, f.cause);
      tr.addEventListener('click', function () {
        showTile(f.tile);
        document.getElementById('sram').scrollIntoView();
      });
    });
  }

  // Self-check ----------------------------------------------------------------
  function need(sel, n, what) {
    var k = document.querySelectorAll(sel).length;
    if (k < n) fail('missing ' + what + ': ' + k + ' of ' + n + ' (' + sel + ')');
  }
  // Clicks as a reader would make them, then back to the opening state.
  function checkInteraction() {
    var shown = view.tile;
    if (D.ops.length) {
      document.querySelector('#op-table th[data-key="cycles"]').click();
      var top = Math.max.apply(null, D.ops.map(function (o) { return o.cycles; }));
      var first = document.querySelector('#op-table tbody tr.op td:nth-child(4)').textContent;
      if (first !== fmt(top)) fail('sorting by cycles put ' + first + ' first, not ' + fmt(top));
      sortKey = 'index';
      sortDir = 1;
      drawOps();
    }
    var cells = document.querySelectorAll('#heatmaps rect.tile');
    if (cells.length) {
      var cell = cells[cells.length - 1];
      var t = cell.getAttribute('data-tile');
      cell.dispatchEvent(new MouseEvent('click', { bubbles: true }));
      var cap = document.getElementById('sram-caption').textContent;
      if (cap.indexOf('tile ' + t + ':') !== 0 && cap.indexOf('tile ' + t + ' ') !== 0) {
        fail('clicking tile ' + t + ' showed: ' + cap);
      }
      showTile(shown);
      window.scrollTo(0, 0);
    }
    // Open a closed layer group and close it again: it must draw its part of
    // the run and its operations.
    var closed = document.querySelector('details.layer-group:not([open])');
    if (closed) {
      var layer = Number(closed.getAttribute('data-layer'));
      if (!openLayer(layer, false)) fail('opening layer ' + layer + ' did not draw it');
      need('#layer-svg-' + layer + ' rect.ss', 1, 'supersteps of layer ' + layer);
      need('details.layer-group[data-layer="' + layer + '"] tr.layer-op', 1, 'operations of layer ' + layer);
      closed.firstChild.click();
      if (closed.open) fail('layer ' + layer + ' did not close');
      window.scrollTo(0, 0);
    }
    if (zooms.encoder) {
      drawTimeline(zooms.encoder[0], zooms.encoder[1]);
      need('#timeline-svg .mark', 2, 'marks of the encoder interval view');
      drawTimeline(D.init_cycles, D.total_cycles);
    }
  }
  try {
    drawTimeline(0, D.total_cycles);
    need('#timeline-svg rect.ss', D.profile.supersteps.length, 'timeline supersteps');
    need('#timeline-svg rect.op', D.op_spans.length, 'timeline operations');
    // Weight streaming can dwarf the inference; open on the cropped span.
    drawTimeline(D.init_cycles, D.total_cycles);
    drawLayers();
    if (D.layers.length) {
      need('#timeline-svg rect.layer', D.layers.filter(function (l) { return l.end > l.start; }).length,
        'layers on the timeline');
      need('details.layer-group', D.layers.length, 'layer groups');
    }
    drawOps();
    drawTiles();
    showTile(firstFault !== null ? firstFault : peakTile);
    drawFaults();
    ['summary', 'timeline', 'ops', 'tiles', 'sram', 'faults'].forEach(function (id) {
      if (!document.getElementById(id)) fail('missing section #' + id);
    });
    need('#timeline-svg rect.ss', 1, 'timeline supersteps of the cropped span');
    need('#timeline-svg .mark', 1, 'cropped span mark');
    need('#op-table tbody tr.op', D.ops.length, 'operation rows');
    need('#heatmaps rect.tile', 2 * D.tiles.length, 'heat-map cells');
    if (D.packed.length) need('#sram-svg rect.buf', 1, 'SRAM viewer buffers');
    need('#fault-list tr.fault', Math.min(D.faults.length, FAULT_ROWS), 'fault rows');
    checkInteraction();
    // `#layer-N` in the address opens that layer's group.
    var m = /^#layer-(\d+)$/.exec(window.location.hash);
    if (m && !openLayer(Number(m[1]), true)) fail('no layer ' + m[1] + ' to open');
  } catch (e) {
    fail('exception: ' + e.message + '\n' + (e.stack || ''));
  }
  document.body.setAttribute('data-render-ms', (performance.now() - t0).toFixed(0));
  if (!errors.length) document.body.setAttribute('data-ok', 'yes');
})();
