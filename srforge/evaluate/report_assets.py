"""The CSS and the script of report.html, kept here as strings so that the page carries them inline (no network, no
external file: the page works opened from the file system).

The script reads the page's data (a JSON block, id ``report-data``; see srforge.evaluate.report.page_data) and
draws what a static page could not afford for 10,000 scans: the plots (inline SVG, one mark per scan), the scan
table (sorted and filtered in memory, only the first rows put into the DOM, more on request) and the picture viewer
(a picture's full-size file loaded only when it is opened; zoom with the wheel or the buttons, pan by dragging).
Every name reaches the page as text (textContent, setAttribute), never as markup.
"""

STYLE = """
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;color:#222;max-width:1250px;padding:0 1em}
h1{margin:.2em 0}h2{margin:1.6em 0 .4em;border-bottom:1px solid #ddd}.about{color:#666;font-size:12px}
table{border-collapse:collapse;margin:.3em 0 1em}th,td{border:1px solid #ddd;padding:2px 7px;text-align:right}
th{background:#f2f2f2;font-weight:600}td:first-child,th:first-child{text-align:left}
thead th{position:sticky;top:0;z-index:1}thead tr+tr th{top:1.6em}
.boxed{max-height:75vh;overflow:auto;border:1px solid #ddd}.boxed table{margin:0}
#scans th{cursor:pointer;user-select:none;max-width:9em}#scans tbody tr{cursor:pointer}
#scans tbody tr:hover{background:#f4f8ff}#scans th[data-order=asc]::after{content:" \\25B2"}
#scans th[data-order=desc]::after{content:" \\25BC"}
#scans td.name{text-align:left;min-width:12em;max-width:22em;overflow-wrap:anywhere}
#scans td.error{text-align:left;color:#b00;max-width:30em;white-space:normal}#scans tr.failed td{background:#fff3f3}
[title]{text-decoration-line:underline;text-decoration-style:dotted;text-decoration-color:#aaa}
.headline{display:flex;flex-wrap:wrap;gap:.8em;margin:.8em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:10em;background:#fafafa}
.card .label{font-size:12px;color:#555}.card .num{font-size:26px;font-weight:600;display:block}
.card .b{font-size:15px;color:#444}.better{color:#1a7f37}.worse{color:#c0392b}
.verdict{font-size:16px;margin:.4em 0 1em}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{border:1px solid #eee}.plot text{font-size:11px;fill:#444}
.plot .mark{fill:#1f6fd1;fill-opacity:.55}.plot .mark.b{fill:#e07b00}.plot .mark:hover{fill:#000;fill-opacity:1}
.plot .axis{stroke:#888}.plot .grid{stroke:#eee}.plot .bar{fill:#1f6fd1}.plot .bar.recall{fill:#2a9d8f}
.plot .diag{stroke:#aaa;stroke-dasharray:4 3}
.filters{display:flex;flex-wrap:wrap;gap:.8em;align-items:center;margin:.5em 0}
.filters input[type=number]{width:6em}#count{color:#555}
figure{margin:0 0 1.2em;overflow-x:auto}
figure img{image-rendering:pixelated;cursor:zoom-in;display:block;box-sizing:content-box;max-width:none;
border:1px solid #ccc}
.key span{display:inline-block;width:1em;height:1em;margin:0 .3em 0 1em;vertical-align:middle}
#viewer{position:fixed;inset:0;background:rgba(20,20,20,.92);z-index:10;display:none;flex-direction:column}
#viewer.open{display:flex}#viewer .bar{color:#eee;padding:.4em .8em;display:flex;gap:.6em;align-items:center}
#viewer .bar .title{flex:1;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
#viewer button{font:inherit;padding:.1em .7em}#stage{flex:1;overflow:hidden;position:relative;cursor:grab}
#content{position:absolute;left:0;top:0;transform-origin:0 0}
#content img{display:block;image-rendering:pixelated;max-width:none;margin-bottom:4px}
#content .panel{color:#eee;font-size:12px;white-space:nowrap}
.broken{color:#c0392b}
"""

SCRIPT = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var col = Object.create(null);  // no inherited keys: a column is found only under its own key
  D.columns.forEach(function (c, i) { col[c.key] = i; });

  // What ``map`` (an object of the page's data) holds under ``key`` itself: scans are keyed by name, and a scan may be
  // named "constructor" or "toString", which ``map[key]`` would find on Object.prototype.
  function own(map, key) { return Object.prototype.hasOwnProperty.call(map, key) ? map[key] : undefined; }
  // One part of the page (a plot, the table, the viewer) run on its own: an error in it is logged and said in its
  // place, and the other parts still work (an uncaught error would stop the whole script).
  function guarded(what, where, run) {
    try {
      run();
    } catch (error) {
      if (window.console) { console.error("report.html: " + what + ":", error); }
      if (where) { where.appendChild(make("p", {"class": "broken"}, what + " could not be drawn (" + error + ")")); }
    }
  }

  function make(tag, attrs, text, ns) {
    var node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  function shape(tag, attrs, text) { return make(tag, attrs, text, NS); }
  function fmt(v, num) {
    if (v === null || v === undefined) { return ""; }
    if (num && typeof v === "number" && !Number.isInteger(v)) { return v.toFixed(3); }
    return String(v);
  }

  // -- plots: inline SVG, one mark (circle) per scan -------------------------------------------------------
  var W = 392, H = 260, L = 46, R = 12, T = 14, B = 36;
  function axes(plot, xs, ys, xlabel, ylabel) {
    var g = plot.svg;
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      var y = ys(plot.y0 + f * (plot.y1 - plot.y0)), x = xs(plot.x0 + f * (plot.x1 - plot.x0));
      g.appendChild(shape("line", {"class": "grid", x1: L, x2: W - R, y1: y, y2: y}));
      var yv = plot.y0 + f * (plot.y1 - plot.y0), xv = plot.x0 + f * (plot.x1 - plot.x0);
      g.appendChild(shape("text", {x: L - 4, y: y + 4, "text-anchor": "end"}, tick(yv, plot.y1 - plot.y0)));
      if (!plot.noXTicks) {
        g.appendChild(shape("text", {x: x, y: H - B + 14, "text-anchor": "middle"}, tick(xv, plot.x1 - plot.x0)));
      }
    });
    g.appendChild(shape("line", {"class": "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
    g.appendChild(shape("line", {"class": "axis", x1: L, x2: L, y1: T, y2: H - B}));
    g.appendChild(shape("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}, xlabel));
    g.appendChild(shape("text", {x: 12, y: (T + H - B) / 2, "text-anchor": "middle",
                                 transform: "rotate(-90 12 " + (T + H - B) / 2 + ")"}, ylabel));
  }
  function tick(v, range) { return range >= 8 ? String(Math.round(v)) : String(Math.round(v * 100) / 100); }
  function newPlot(id, title, x0, x1, y0, y1) {
    var svg = shape("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, "class": "plot", id: id});
    svg.appendChild(shape("title", {}, title));
    var plot = {svg: svg, x0: x0, x1: x1 > x0 ? x1 : x0 + 1, y0: y0, y1: y1 > y0 ? y1 : y0 + 1};
    plot.xs = function (v) { return L + (v - plot.x0) / (plot.x1 - plot.x0) * (W - L - R); };
    plot.ys = function (v) { return H - B - (v - plot.y0) / (plot.y1 - plot.y0) * (H - T - B); };
    return plot;
  }
  function scatter(id, title, xkey, ykey, xlabel, ylabel, diagonal) {
    var pts = D.rows.filter(function (r) {
      return typeof r[col[xkey]] === "number" && typeof r[col[ykey]] === "number";
    });
    var xv = pts.map(function (r) { return r[col[xkey]]; });
    // A loop, not Math.min.apply: some browsers cap a call's arguments near 65,536, and a plot has a value a scan.
    var lo = Infinity, hi = -Infinity;
    xv.forEach(function (v) { if (v < lo) { lo = v; } if (v > hi) { hi = v; } });
    if (diagonal || !isFinite(lo)) { lo = 0; hi = 1; }
    var pad = diagonal ? 0 : (hi - lo) * 0.03;
    var plot = newPlot(id, title, lo - pad, hi + pad, 0, 1);
    axes(plot, plot.xs, plot.ys, xlabel, ylabel);
    if (diagonal) {
      var ends = {"class": "diag", x1: plot.xs(0), y1: plot.ys(0), x2: plot.xs(1), y2: plot.ys(1)};
      plot.svg.appendChild(shape("line", ends));
    }
    var marks = shape("g", {"class": "marks"});
    pts.forEach(function (r) {
      var at = {cx: plot.xs(r[col[xkey]]).toFixed(1), cy: plot.ys(r[col[ykey]]).toFixed(1)};
      var c = shape("circle", {"class": "mark", r: 3, cx: at.cx, cy: at.cy});
      c.__name = r[col.name];
      marks.appendChild(c);
    });
    marks.addEventListener("click", function (e) { if (e.target.__name !== undefined) { openScan(e.target.__name); } });
    marks.addEventListener("mouseover", function (e) {
      var r = e.target.__name;
      if (r !== undefined) { tip.textContent = r; }
    });
    plot.svg.appendChild(marks);
    return plot.svg;
  }
  function histogram(id, key, label) {
    var bins = [], n = 20, i;
    for (i = 0; i < n; i++) { bins.push(0); }
    D.rows.forEach(function (r) {
      var v = r[col[key]];
      if (typeof v === "number") { bins[Math.min(n - 1, Math.max(0, Math.floor(v * n)))] += 1; }
    });
    var top = 1;
    bins.forEach(function (count) { top = Math.max(top, count); });
    var plot = newPlot(id, "scans by " + label, 0, 1, 0, top);
    axes(plot, plot.xs, plot.ys, label, "scans");
    bins.forEach(function (count, k) {
      var x = plot.xs(k / n), y = plot.ys(count);
      var bar = shape("rect", {"class": "bar", x: x + 1, y: y, width: plot.xs(1 / n) - L - 2, height: H - B - y});
      bar.appendChild(shape("title", {}, count + " scans with " + label + " in [" + k / n + ", " + (k + 1) / n + ")"));
      plot.svg.appendChild(bar);
    });
    return plot.svg;
  }
  function classBars(id) {
    var plot = newPlot(id, "precision and recall per class (micro)", 0, D.pr.length, 0, 1);
    plot.noXTicks = true;
    axes(plot, plot.xs, plot.ys, "", "precision (blue) | recall (green)");
    var step = plot.xs(1) - plot.xs(0);
    D.pr.forEach(function (p, k) {
      ["precision", "recall"].forEach(function (f, j) {
        var v = typeof p[f] === "number" ? p[f] : 0, x = plot.xs(k) + step * (0.1 + 0.4 * j), y = plot.ys(v);
        var bar = shape("rect", {"class": "bar " + f, x: x, y: y, width: step * 0.38, height: H - B - y});
        bar.appendChild(shape("title", {}, p.label + " " + f + ": " + fmt(p[f], true)));
        plot.svg.appendChild(bar);
      });
      plot.svg.appendChild(shape("text", {x: plot.xs(k) + step / 2, y: H - B + 26, "text-anchor": "middle"}, p.label));
    });
    return plot.svg;
  }
  var tip = document.getElementById("tip");
  var plots = document.getElementById("plots");
  if (plots) {
    var p = D.primary, plabel = own(D.labels, p) || p;
    var drawn = [
      ["the plot against width", function () {
        return scatter("plot-width", plabel + " against width", "width", p, "width (px)", plabel);
      }],
      ["the plot against height", function () {
        return scatter("plot-height", plabel + " against height", "height", p, "height (px)", plabel);
      }],
      ["the histogram", function () { return histogram("plot-histogram", p, plabel); }],
      ["the plot of classes", function () { return classBars("plot-classes"); }]
    ];
    if (D.compare) {
      drawn.push(["the plot of A against B", function () {
        return scatter("plot-compare", plabel + ": A against B", p, D.bkey, plabel + " of A", plabel + " of B", true);
      }]);
    }
    drawn.forEach(function (part) {
      guarded(part[0], plots, function () { plots.appendChild(part[1]()); });
    });
  }

  // -- the scan table: sorted and filtered in memory, the first `shown` rows in the DOM ----------------------
  var table = document.getElementById("scans"), PAGE = 200;
  var state = {order: null, asc: true, shown: PAGE};
  function head() {
    var tr = make("tr");
    D.columns.forEach(function (c, i) {
      var th = make("th", c.title ? {title: c.title} : {}, c.label);
      th.addEventListener("click", function () {
        state.asc = state.order === i ? !state.asc : true;
        state.order = i;
        table.querySelectorAll("th").forEach(function (h) { delete h.dataset.order; });
        th.dataset.order = state.asc ? "asc" : "desc";
        render();
      });
      tr.appendChild(th);
    });
    table.tHead.appendChild(tr);
  }
  function matching() {
    var text = document.getElementById("f-name").value.toLowerCase();
    var status = document.getElementById("f-status").value;
    var metric = document.getElementById("f-metric").value;
    var limit = parseFloat(document.getElementById("f-limit").value);
    var below = document.getElementById("f-op").value === "below";
    return D.rows.filter(function (r) {
      if (text && String(r[col.name]).toLowerCase().indexOf(text) < 0) { return false; }
      if (status && r[col.status] !== status) { return false; }
      if (metric && !isNaN(limit)) {
        var v = r[col[metric]];
        if (typeof v !== "number" || (below ? v > limit : v < limit)) { return false; }
      }
      return true;
    });
  }
  function sorted(rows) {
    if (state.order === null) { return rows; }  // the page's own order: failed first, then worst first
    var i = state.order, num = D.columns[i].num, sign = state.asc ? 1 : -1;
    return rows.slice().sort(function (a, b) {
      var x = a[i], y = b[i], nx = x === null || x === undefined, ny = y === null || y === undefined;
      if (nx || ny) { return nx - ny; }  // empty cells last, either way
      return sign * (num ? x - y : String(x).localeCompare(String(y)));
    });
  }
  function render() {
    var rows = sorted(matching()), body = make("tbody");
    rows.slice(0, state.shown).forEach(function (r) {
      var tr = make("tr", r[col.status] === "ok" ? {} : {"class": "failed"});
      D.columns.forEach(function (c, i) {
        var td = make("td", c.key === "name" || c.key === "error" ? {"class": c.key} : {}, fmt(r[i], c.num));
        tr.appendChild(td);
      });
      tr.__name = r[col.name];
      body.appendChild(tr);
    });
    table.replaceChild(body, table.tBodies[0]);
    var shown = Math.min(state.shown, rows.length);
    document.getElementById("count").textContent =
      rows.length + " of " + D.rows.length + " scans match" +
      (shown < rows.length ? ", the first " + shown + " shown" : "");
    document.getElementById("more").style.display = shown < rows.length ? "" : "none";
  }
  if (table) guarded("the scan table", table.parentNode, function () {
    head();
    table.appendChild(make("tbody"));
    table.addEventListener("click", function (e) {
      var tr = e.target.closest("tbody tr");
      if (tr) { openScan(tr.__name); }
    });
    ["f-name", "f-status", "f-metric", "f-limit", "f-op"].forEach(function (id) {
      document.getElementById(id).addEventListener("input", function () { state.shown = PAGE; render(); });
    });
    document.getElementById("more").addEventListener("click", function () { state.shown += 5 * PAGE; render(); });
    render();
  });

  // -- the viewer: a scan's pictures at full resolution, zoomed and panned inside the page -----------------
  var viewer = document.getElementById("viewer"), stage = document.getElementById("stage");
  var content = document.getElementById("content"), view = {s: 1, x: 0, y: 0, w: 1, h: 1};
  function place() {
    content.style.transform = "translate(" + view.x + "px," + view.y + "px) scale(" + view.s + ")";
    viewer.dataset.scale = view.s;
    document.getElementById("zoom").textContent = Math.round(view.s * 100) + "%";
  }
  function zoom(factor, cx, cy) {
    var s = Math.min(64, Math.max(0.02, view.s * factor));
    view.x = cx - (cx - view.x) * s / view.s;
    view.y = cy - (cy - view.y) * s / view.s;
    view.s = s;
    place();
  }
  function fit() {
    var box = stage.getBoundingClientRect();
    view.s = Math.min(box.width / view.w, box.height / view.h, 64);
    view.x = (box.width - view.w * view.s) / 2;
    view.y = Math.max(0, (box.height - view.h * view.s) / 2);
    place();
  }
  function panel(label, src, w, h, filter) {
    content.appendChild(make("div", {"class": "panel"}, label));
    var img = make("img", {src: src, width: w, height: h, alt: label, draggable: "false"});
    if (filter) { img.style.filter = "url(#class-colours)"; }
    content.appendChild(img);
    return h + 22;
  }
  function openScan(name) {
    var shots = own(D.pictures, name) || [], files = own(D.sources, name);
    var row = D.rows.filter(function (r) { return r[col.name] === name; })[0];
    content.textContent = "";
    var h = 0, w = 1;
    if (shots.length) {
      shots.forEach(function (s) {
        h += panel("model " + s.model + ": the scan above, its errors below", s.file, s.width, s.height);
        w = Math.max(w, s.width);
      });
    } else if (files && row) {
      var sw = row[col.width], sh = row[col.height];
      ["scan", "truth", "A", "B"].forEach(function (k) {
        if (files[k]) {
          var label = k === "scan" || k === "truth" ? k : "prediction of " + k;
          h += panel(label, files[k], sw, sh, k !== "scan");
        }
      });
      w = sw;
    } else {
      var why = row && row[col.status] !== "ok" ? "it was not scored"
        : "only the --worst scans are drawn, and its files are in an archive";
      content.appendChild(make("div", {"class": "panel"}, "No picture of this scan: " + why));
    }
    document.getElementById("viewer-title").textContent = name;
    view.w = w;
    view.h = Math.max(h, 1);
    viewer.classList.add("open");
    fit();
  }
  if (viewer) guarded("the picture viewer", null, function () {
    document.querySelectorAll("figure img[data-name]").forEach(function (img) {
      img.addEventListener("click", function () { openScan(img.dataset.name); });
    });
    document.getElementById("close").addEventListener("click", function () { viewer.classList.remove("open"); });
    document.getElementById("fit").addEventListener("click", fit);
    document.getElementById("one").addEventListener("click", function () {
      view.s = 1; view.x = 0; view.y = 0; place();
    });
    document.getElementById("in").addEventListener("click", function () { zoom(2, 0, 0); });
    document.getElementById("out").addEventListener("click", function () { zoom(0.5, 0, 0); });
    stage.addEventListener("wheel", function (e) {
      e.preventDefault();
      var box = stage.getBoundingClientRect();
      zoom(e.deltaY < 0 ? 1.25 : 0.8, e.clientX - box.left, e.clientY - box.top);
    }, {passive: false});
    var drag = null;
    stage.addEventListener("mousedown", function (e) {
      drag = {x: e.clientX - view.x, y: e.clientY - view.y};
      e.preventDefault();
    });
    window.addEventListener("mousemove", function (e) {
      if (drag) { view.x = e.clientX - drag.x; view.y = e.clientY - drag.y; place(); }
    });
    window.addEventListener("mouseup", function () { drag = null; });
    document.addEventListener("keydown", function (e) {
      if (e.key === "Escape") { viewer.classList.remove("open"); }
    });
  });
})();
"""
