// memwarden HTML report: draws the live-memory timeline and the module lanes on <canvas>.
// No libraries, no network. Data comes from the JSON block #mw-data (written by report/html.py).
// Strings from the trace (module paths, fingerprints) only ever go into textContent.
(function () {
  "use strict";

  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  var M = { l: 86, r: 20, t: 30, b: 30 }; // plot margins in CSS px, shared by both canvases
  var TIMELINE_HEIGHT = 380;
  var ROW = 17; // lane row pitch in CSS px
  var PEAK_COLOR = "#111";

  var status = document.getElementById("mw-status");
  try {
    main();
  } catch (err) {
    document.body.dataset.renderError = String((err && err.message) || err);
    var box = document.createElement("p");
    box.className = "mw-error";
    box.textContent = "The interactive plot failed to draw: " + document.body.dataset.renderError;
    var tl = document.getElementById("timeline");
    if (tl) tl.appendChild(box);
  }

  // -- formatting -----------------------------------------------------------
  // fmtBytes and fmtTime print what memwarden.units.format_bytes / format_us print in tables and the terminal.
  function fmtBytes(b) {
    var sign = b < 0 ? "-" : "";
    var v = Math.abs(b);
    var i = 0;
    while (v >= 1024 && i < UNITS.length - 1) {
      v /= 1024;
      i++;
    }
    return i === 0 ? sign + Math.round(v) + " B" : sign + v.toFixed(1) + " " + UNITS[i];
  }

  function fmtTime(us) {
    if (us < 1000) return Math.round(us) + " µs";
    if (us < 1e6) return (us / 1000).toFixed(1) + " ms";
    return (us / 1e6).toFixed(2) + " s";
  }

  function timeUnit(spanUs) {
    if (spanUs < 2000) return { div: 1, name: "µs" };
    if (spanUs < 2e6) return { div: 1000, name: "ms" };
    return { div: 1e6, name: "s" };
  }

  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * mag >= raw) return steps[i] * mag;
    return 10 * mag;
  }

  // Enough decimals to print every multiple of step exactly (0.25 -> 2, so no "0.3 MiB" ticks).
  function decimalsFor(step) {
    var d = 0;
    while (d < 6 && Math.abs(step * Math.pow(10, d) - Math.round(step * Math.pow(10, d))) > 1e-6) d++;
    return d;
  }

  // Byte ticks in one binary unit with a 1/2/2.5/5 step: 0, 256 MiB, 512 MiB, ...
  function byteTicks(maxBytes, count) {
    if (!(maxBytes > 0)) maxBytes = 1;
    var p = 0;
    while (maxBytes / Math.pow(1024, p) >= 1024 && p < UNITS.length - 1) p++;
    var unit = Math.pow(1024, p);
    var step = niceStep(maxBytes / unit / count);
    var top = Math.ceil(maxBytes / unit / step - 1e-9) * step;
    var ticks = [];
    var digits = decimalsFor(step);
    for (var v = 0; v <= top + step * 1e-6; v += step) {
      ticks.push({ value: v * unit, label: (p === 0 ? Math.round(v) : v.toFixed(digits)) + " " + UNITS[p] });
    }
    return { ticks: ticks, max: top * unit };
  }

  function timeTicks(t0, t1, count) {
    var u = timeUnit(t1 - t0);
    var step = niceStep((t1 - t0) / count / u.div) * u.div;
    var digits = decimalsFor(step / u.div);
    var out = [];
    for (var t = Math.ceil(t0 / step) * step; t <= t1 + step * 1e-6; t += step) {
      out.push({ value: t, label: (t / u.div).toFixed(digits) + " " + u.name });
    }
    return out;
  }

  // Last index k with a[k] <= x (0 if none).
  function floorIndex(a, x) {
    var lo = 0,
      hi = a.length - 1,
      ans = 0;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (a[mid] <= x) {
        ans = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return ans;
  }

  function setupCanvas(canvas, cssHeight) {
    var dpr = window.devicePixelRatio || 1;
    var w = Math.max(320, canvas.parentNode.clientWidth);
    canvas.style.width = w + "px";
    canvas.style.height = cssHeight + "px";
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(cssHeight * dpr);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, cssHeight);
    ctx.font = "12px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
    return { ctx: ctx, w: w, h: cssHeight };
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // -- the page ---------------------------------------------------------------
  function main() {
    var data = JSON.parse(document.getElementById("mw-data").textContent);
    var tlCanvas = document.getElementById("mw-timeline");
    var lnCanvas = document.getElementById("mw-lanes");
    var tooltip = document.getElementById("mw-tooltip");
    var legend = document.getElementById("mw-legend");
    var resetBtn = document.getElementById("mw-reset");
    var lanes = data.lanes;
    var full = [0, Math.max(1, data.duration_us)];
    // baseline: the y-axis starts at the constant weights when they are most of the peak, so the
    // memory that changes (activations, KV cache, encoder outputs) fills the plot.
    var state = { by: "category", view: null, hidden: {}, focus: 0,
                  baseline: data.baseline_bytes > 0 && data.baseline_bytes >= 0.5 * data.peak.bytes };
    var fromHash = /(?:^#|&)by=(category|modality|phase)\b/.exec(window.location.hash);
    if (fromHash) state.by = fromHash[1];
    var drawn = { series: 0, points: 0, spans: 0, markers: 0, boxes: [] };
    var baseBtn = document.getElementById("mw-baseline");
    function baseBytes() {
      if (!state.baseline) return 0;
      if (state.by === "category" && (state.hidden.weight || state.hidden.buffer)) return 0;
      return data.baseline_bytes || 0;
    }
    var geom = null; // last timeline geometry, for hover

    function view() {
      return state.view || full;
    }
    function xOf(t, w) {
      var v = view();
      return M.l + ((t - v[0]) / (v[1] - v[0])) * (w - M.l - M.r);
    }
    function tOf(x, w) {
      var v = view();
      return v[0] + ((x - M.l) / (w - M.l - M.r)) * (v[1] - v[0]);
    }

    // Lane rows: optional phase row, then one row per module depth.
    var rowsByLane = [];
    var phaseRow = lanes.phases.length ? 1 : 0;
    var mod = lanes.modules;
    var maxDepth = -1;
    for (var i = 0; i < mod.depth.length; i++) maxDepth = Math.max(maxDepth, mod.depth[i]);
    var nRows = phaseRow + maxDepth + 1;
    for (var r = 0; r < nRows; r++) rowsByLane.push([]);
    for (var j = 0; j < mod.depth.length; j++) rowsByLane[phaseRow + mod.depth[j]].push(j);

    function buildLegend() {
      legend.textContent = "";
      var tl = data.timelines[state.by];
      var peakK = tl.time_us.length ? floorIndex(tl.time_us, data.peak.time_us) : 0;
      tl.series.forEach(function (s) {
        var b = el("button", "mw-legend-item" + (state.hidden[s.name] ? " off" : ""));
        b.type = "button";
        var sw = el("span", "mw-swatch");
        sw.style.background = data.palette[state.by][s.name] || "#888";
        b.appendChild(sw);
        b.appendChild(el("span", "mw-legend-name", s.name));
        b.appendChild(el("span", "mw-legend-val", fmtBytes(s.values[peakK] || 0) + " at peak"));
        b.title = "click to hide or show " + s.name;
        b.addEventListener("click", function () {
          state.hidden[s.name] = !state.hidden[s.name];
          buildLegend();
          drawTimeline();
          publish();
        });
        legend.appendChild(b);
      });
    }

    function drawAxesX(ctx, w, yBase, grid, yTop) {
      var v = view();
      var ticks = timeTicks(v[0], v[1], Math.max(3, Math.floor((w - M.l - M.r) / 110)));
      ctx.fillStyle = "#555";
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      ctx.strokeStyle = "#e4e4e4";
      ctx.lineWidth = 1;
      ticks.forEach(function (tk) {
        var x = Math.round(xOf(tk.value, w)) + 0.5;
        if (x < M.l - 1 || x > w - M.r + 1) return;
        if (grid) {
          ctx.beginPath();
          ctx.moveTo(x, yTop);
          ctx.lineTo(x, yBase);
          ctx.stroke();
        }
        var half = ctx.measureText(tk.label).width / 2;
        ctx.fillText(tk.label, Math.min(Math.max(x, half + 1), w - half - 1), yBase + 6); // keep edge labels whole
      });
      ctx.strokeStyle = "#999";
      ctx.beginPath();
      ctx.moveTo(M.l, yBase + 0.5);
      ctx.lineTo(w - M.r, yBase + 0.5);
      ctx.stroke();
    }

    // Findings (or any caller's markers): a numbered flag at the top of the plot,
    // a thin line down to the axis; clicking the number jumps to its section.
    var MARKER_COLORS = { high: "#c62828", medium: "#ef6c00", low: "#757575" };
    function drawMarkers(ctx, w, yTop, yBase) {
      var marks = data.markers || [];
      var v = view();
      var placed = [];
      var labels = [];
      drawn.markers = 0;
      drawn.boxes = [];
      var flagsX = marks.filter(function (m) { return m.time_us >= v[0] && m.time_us <= v[1]; })
        .map(function (m) { return Math.round(xOf(m.time_us, w)) + 0.5; });
      ctx.save();
      ctx.font = "bold 11px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
      for (var i = 0; i < marks.length; i++) {
        var t = marks[i].time_us;
        if (t < v[0] || t > v[1]) continue;
        var x = Math.round(xOf(t, w)) + 0.5;
        var row = 0;
        while (placed.some(function (p) { return p.row === row && Math.abs(p.x - x) < 18; })) row++;
        placed.push({ x: x, row: row });
        var y = yTop + 10 + row * 18;
        var color = MARKER_COLORS[marks[i].severity] || "#455a64";
        ctx.strokeStyle = color;
        ctx.globalAlpha = 0.6;
        ctx.beginPath();
        ctx.moveTo(x, y + 8);
        ctx.lineTo(x, yBase);
        ctx.stroke();
        ctx.globalAlpha = 1;
        ctx.fillStyle = color;
        ctx.beginPath();
        ctx.arc(x, y, 8, 0, 2 * Math.PI);
        ctx.fill();
        ctx.fillStyle = "#fff";
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        var num = marks[i].finding || i + 1;
        ctx.fillText(String(num), x, y + 0.5);
        drawn.markers++;
        drawn.boxes.push({ x: x, y: y, i: i });
        // The text label beside the flag where it has room (always for the finding in focus);
        // every flag also has it as a tooltip.
        var text = marks[i].label.length > 48 ? marks[i].label.slice(0, 47) + "…" : marks[i].label;
        ctx.font = "11px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
        var tw = ctx.measureText(text).width;
        var lx = x + 11 + tw > w - M.r ? x - 11 - tw : x + 11;
        var box = { a: lx - 2, b: lx + tw + 2, y: y };
        var focused = state.focus && marks[i].finding === state.focus;
        var free = !labels.some(function (q) { return Math.abs(q.y - box.y) < 16 && q.a < box.b && box.a < q.b; }) &&
          !flagsX.some(function (fx) { return Math.abs(fx - x) > 1 && fx > box.a - 10 && fx < box.b + 10; });
        if (free || focused) {
          labels.push(box);
          ctx.fillStyle = "rgba(255,255,255,0.85)";
          ctx.fillRect(box.a, y - 7, box.b - box.a, 14);
          ctx.fillStyle = color;
          ctx.textAlign = "left";
          ctx.fillText(text, lx, y + 0.5);
        }
        ctx.font = "bold 11px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
      }
      ctx.restore();
      var status = document.getElementById("mw-status");
      if (status) {
        // markers: the things marked (a finding with several evidence flags counts once); flags: drawn
        var marked = {};
        drawn.boxes.forEach(function (b) { var m = marks[b.i]; marked[m.finding ? "f" + m.finding : "m" + b.i] = 1; });
        status.setAttribute("data-markers", String(Object.keys(marked).length));
        status.setAttribute("data-flags", String(drawn.markers));
        var b0 = drawn.boxes[0];
        status.setAttribute("data-marker-xy", b0 ? b0.x + "," + b0.y : "");
      }
    }

    function drawPeakLine(ctx, w, yTop, yBase) {
      var v = view();
      var t = data.peak.time_us;
      if (t < v[0] || t > v[1] || !data.peak.bytes) return null;
      var x = Math.round(xOf(t, w)) + 0.5;
      ctx.save();
      ctx.strokeStyle = PEAK_COLOR;
      ctx.setLineDash([5, 4]);
      ctx.lineWidth = 1.25;
      ctx.beginPath();
      ctx.moveTo(x, yTop);
      ctx.lineTo(x, yBase);
      ctx.stroke();
      ctx.restore();
      return x;
    }

    function drawTimeline() {
      var tl = data.timelines[state.by];
      var g = setupCanvas(tlCanvas, TIMELINE_HEIGHT);
      var ctx = g.ctx,
        w = g.w,
        h = g.h;
      var yBase = h - M.b,
        yTop = M.t;
      var times = tl.time_us;
      var n = times.length;
      drawn.series = 0;
      drawn.points = 0;
      geom = null;
      if (!n) {
        ctx.fillStyle = "#777";
        ctx.textAlign = "center";
        ctx.fillText("this trace has no allocation events", w / 2, h / 2);
        return;
      }
      var v = view();
      var k0 = floorIndex(times, v[0]);
      var k1 = Math.max(k0, floorIndex(times, v[1]));
      var tEnd = Math.max(times[n - 1], data.duration_us);
      var series = tl.series.filter(function (s) {
        return !state.hidden[s.name];
      });
      var m = k1 - k0 + 1;
      var stack = new Float64Array(m);
      var yMaxData = 0;
      series.forEach(function (s) {
        for (var k = 0; k < m; k++) stack[k] += Math.max(0, s.values[k0 + k]);
      });
      for (var k = 0; k < m; k++) yMaxData = Math.max(yMaxData, stack[k]);
      if (!state.view) yMaxData = Math.max(yMaxData, series.length === tl.series.length ? data.peak.bytes : 0);
      var base = baseBytes();
      if (base >= yMaxData) base = 0; // nothing above the weights in this view: plot from zero
      var yt = byteTicks((yMaxData - base) * 1.04, 5);
      // With a baseline the weights keep a band at the bottom (0 .. base squeezed into it) and
      // the memory above them gets the rest of the height.
      var yBand = base ? yBase - Math.round(0.14 * (yBase - yTop)) : yBase;
      function yOf(b) {
        if (base && b < base) return yBase - (Math.max(0, b) / base) * (yBase - yBand);
        return yBand - ((b - base) / yt.max) * (yBand - yTop);
      }

      // grid + y labels
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      yt.ticks.forEach(function (tk) {
        var y = Math.round(yOf(base + tk.value)) + 0.5; // ticks count bytes above the baseline
        ctx.strokeStyle = "#e4e4e4";
        ctx.beginPath();
        ctx.moveTo(M.l, y);
        ctx.lineTo(w - M.r, y);
        ctx.stroke();
        ctx.fillStyle = "#555";
        ctx.fillText(base ? (tk.value ? "+" + tk.label : fmtBytes(base)) : tk.label, M.l - 8, y);
      });
      if (base) {
        ctx.fillStyle = "#555";
        ctx.fillText("0 B", M.l - 8, yBase);
      }
      drawAxesX(ctx, w, yBase, true, yTop);

      // stacked step areas: value[k] holds from times[k] until times[k+1]
      var xs = new Float64Array(m + 1);
      for (var q = 0; q < m; q++) xs[q] = xOf(times[k0 + q], w);
      xs[m] = xOf(k1 + 1 < n ? times[k1 + 1] : tEnd, w);
      ctx.save();
      ctx.beginPath();
      ctx.rect(M.l, yTop - 2, w - M.l - M.r, yBase - yTop + 2);
      ctx.clip();
      var bottom = new Float64Array(m);
      series.forEach(function (s) {
        var top = new Float64Array(m);
        for (var k = 0; k < m; k++) top[k] = bottom[k] + Math.max(0, s.values[k0 + k]);
        ctx.beginPath();
        ctx.moveTo(xs[0], yOf(top[0]));
        for (var a = 0; a < m; a++) {
          ctx.lineTo(xs[a], yOf(top[a]));
          ctx.lineTo(xs[a + 1], yOf(top[a]));
        }
        for (var b = m - 1; b >= 0; b--) {
          ctx.lineTo(xs[b + 1], yOf(bottom[b]));
          ctx.lineTo(xs[b], yOf(bottom[b]));
        }
        ctx.closePath();
        ctx.fillStyle = data.palette[state.by][s.name] || "#888";
        ctx.fill();
        bottom = top;
      });
      // outline of the visible total
      ctx.beginPath();
      ctx.moveTo(xs[0], yOf(bottom[0]));
      for (var c = 0; c < m; c++) {
        ctx.lineTo(xs[c], yOf(bottom[c]));
        ctx.lineTo(xs[c + 1], yOf(bottom[c]));
      }
      ctx.strokeStyle = "rgba(0,0,0,0.55)";
      ctx.lineWidth = 1;
      ctx.stroke();
      ctx.restore();
      if (base) {
        // the band's edge and what it holds
        ctx.strokeStyle = "rgba(255,255,255,0.9)";
        ctx.setLineDash([6, 4]);
        ctx.beginPath();
        ctx.moveTo(M.l, yBand + 0.5);
        ctx.lineTo(w - M.r, yBand + 0.5);
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.font = "11px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
        ctx.textAlign = "left";
        ctx.textBaseline = "middle";
        var note = "weights " + fmtBytes(base) + " (constant after load), drawn as a band; the axis above counts the rest";
        ctx.fillStyle = "rgba(255,255,255,0.85)";
        ctx.fillRect(M.l + 4, (yBand + yBase) / 2 - 8, ctx.measureText(note).width + 6, 16);
        ctx.fillStyle = "#2f4f6f";
        ctx.fillText(note, M.l + 7, (yBand + yBase) / 2);
      }
      drawn.base = base;

      // peak marker + label
      var px = drawPeakLine(ctx, w, yTop - 4, yBase);
      if (px !== null) {
        var py = yOf(data.peak.bytes);
        if (series.length === tl.series.length && py >= yTop - 2) {
          ctx.beginPath();
          ctx.arc(px, py, 4, 0, 2 * Math.PI);
          ctx.fillStyle = "#fff";
          ctx.fill();
          ctx.strokeStyle = PEAK_COLOR;
          ctx.lineWidth = 2;
          ctx.stroke();
        }
        var label = "peak " + fmtBytes(data.peak.bytes) + " at " + fmtTime(data.peak.time_us);
        ctx.font = "bold 12px system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif";
        var tw = ctx.measureText(label).width;
        var lx = px + 6 + tw > w - M.r ? px - 6 - tw : px + 6;
        ctx.fillStyle = "rgba(255,255,255,0.9)";
        ctx.fillRect(lx - 3, 4, tw + 6, 18);
        ctx.fillStyle = PEAK_COLOR;
        ctx.textAlign = "left";
        ctx.textBaseline = "middle";
        ctx.fillText(label, lx, 13);
      }
      drawMarkers(ctx, w, yTop, yBase);
      drawn.series = series.length;
      drawn.points = m;
      geom = { w: w, yTop: yTop, yBase: yBase, k0: k0, k1: k1 };
    }

    function shortLabel(ctx, name, width) {
      if (ctx.measureText(name).width <= width) return name;
      var parts = name.split(".");
      for (var i = 1; i < parts.length; i++) {
        var s = "…" + parts.slice(i).join(".");
        if (ctx.measureText(s).width <= width) return s;
      }
      var last = parts[parts.length - 1];
      for (var n = last.length - 1; n >= 3; n--) {
        var cut = last.slice(0, n) + "…";
        if (ctx.measureText(cut).width <= width) return cut;
      }
      return "";
    }

    function lanesHeight() {
      return 8 + nRows * ROW + M.b;
    }

    function drawLanes() {
      var note = document.getElementById("mw-lanes-note");
      if (!nRows) {
        lnCanvas.parentNode.hidden = true;
        note.textContent = "This trace has no module or phase spans.";
        drawn.spans = 0;
        return;
      }
      if (lanes.shown < lanes.total) {
        note.textContent =
          "Showing the " + lanes.shown + " longest of " + lanes.total + " module calls; the table below counts all.";
      }
      var g = setupCanvas(lnCanvas, lanesHeight());
      var ctx = g.ctx,
        w = g.w;
      var top = 8;
      var yBase = top + nRows * ROW;
      var v = view();
      var count = 0;
      // row labels and bands
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      for (var r = 0; r < nRows; r++) {
        var y = top + r * ROW;
        if (r % 2 === 1) {
          ctx.fillStyle = "#f6f6f6";
          ctx.fillRect(M.l, y, w - M.l - M.r, ROW);
        }
        ctx.fillStyle = "#555";
        ctx.fillText(phaseRow && r === 0 ? "phase" : "depth " + (r - phaseRow), M.l - 8, y + ROW / 2);
      }
      ctx.save();
      ctx.beginPath();
      ctx.rect(M.l, 0, w - M.l - M.r, yBase);
      ctx.clip();
      ctx.textAlign = "left";
      function box(x0, x1, y, color, text) {
        var bw = Math.max(1, x1 - x0);
        ctx.fillStyle = color;
        ctx.fillRect(x0, y + 1, bw, ROW - 3);
        if (bw > 4) {
          ctx.strokeStyle = "rgba(255,255,255,0.8)";
          ctx.strokeRect(x0 + 0.5, y + 1.5, bw - 1, ROW - 4);
        }
        var lx = Math.max(x0, M.l) + 3;
        var avail = Math.min(x1, w - M.r) - lx - 3;
        if (avail > 24 && text) {
          var s = shortLabel(ctx, text, avail);
          if (s) {
            ctx.fillStyle = "#1a1a1a";
            ctx.fillText(s, lx, y + ROW / 2);
          }
        }
      }
      lanes.phases.forEach(function (p) {
        if (p.end < v[0] || p.start > v[1]) return;
        box(xOf(p.start, w), xOf(p.end, w), top, data.palette.phase[p.phase] || "#bbb", p.name);
        count++;
      });
      for (var k = 0; k < mod.start.length; k++) {
        if (mod.end[k] < v[0] || mod.start[k] > v[1]) continue;
        var name = mod.name[k] >= 0 ? lanes.strings[mod.name[k]] : "";
        box(
          xOf(mod.start[k], w),
          xOf(mod.end[k], w),
          top + (phaseRow + mod.depth[k]) * ROW,
          data.palette.modality[mod.modality[k]] || "#bbb",
          name
        );
        count++;
      }
      ctx.restore();
      drawPeakLine(ctx, w, 0, yBase);
      drawAxesX(ctx, w, yBase, false, 0);
      drawn.spans = count;
    }

    // -- hover, zoom ----------------------------------------------------------
    var cursor = el("div", "mw-cursor");
    cursor.hidden = true;
    tlCanvas.parentNode.appendChild(cursor);
    var selection = el("div", "mw-selection");
    selection.hidden = true;
    tlCanvas.parentNode.appendChild(selection);

    function showTooltip(evt, build) {
      tooltip.textContent = "";
      build(tooltip);
      tooltip.hidden = false;
      var pad = 14;
      var r = tooltip.getBoundingClientRect();
      var x = evt.clientX + pad,
        y = evt.clientY + pad;
      if (x + r.width > window.innerWidth - 4) x = evt.clientX - pad - r.width;
      if (y + r.height > window.innerHeight - 4) y = Math.max(4, evt.clientY - pad - r.height);
      tooltip.style.left = x + "px";
      tooltip.style.top = y + "px";
    }
    function hideHover() {
      tooltip.hidden = true;
      cursor.hidden = true;
    }
    function row(box, color, name, value) {
      var line = el("div", "mw-tip-row");
      var sw = el("span", "mw-swatch");
      if (color) sw.style.background = color;
      else sw.style.visibility = "hidden";
      line.appendChild(sw);
      line.appendChild(el("span", "mw-tip-name", name));
      line.appendChild(el("span", "mw-tip-val", value));
      box.appendChild(line);
    }

    function localX(evt, canvas) {
      var rect = canvas.getBoundingClientRect();
      return { x: evt.clientX - rect.left, y: evt.clientY - rect.top };
    }

    var drag = null;
    tlCanvas.addEventListener("mousemove", function (evt) {
      if (!geom) return;
      var p = localX(evt, tlCanvas);
      if (drag) {
        var a = Math.max(M.l, Math.min(drag, p.x)),
          b = Math.min(geom.w - M.r, Math.max(drag, p.x));
        selection.style.left = a + "px";
        selection.style.width = b - a + "px";
        selection.style.top = geom.yTop + "px";
        selection.style.height = geom.yBase - geom.yTop + "px";
        selection.hidden = false;
      }
      if (p.x < M.l || p.x > geom.w - M.r || p.y < geom.yTop - 10 || p.y > geom.yBase) {
        hideHover();
        return;
      }
      var hit = markerAt(p);
      if (hit) {
        cursor.hidden = true;
        showTooltip(evt, function (box) {
          box.appendChild(el("div", "mw-tip-head", hit.label));
          if (hit.detail) box.appendChild(el("div", "mw-tip-detail", hit.detail));
          row(box, null, "time", fmtTime(hit.time_us));
          if (hit.anchor) row(box, null, "click", "go to the finding");
        });
        tlCanvas.style.cursor = hit.anchor ? "pointer" : "default";
        return;
      }
      tlCanvas.style.cursor = "crosshair";
      var tl = data.timelines[state.by];
      var t = tOf(p.x, geom.w);
      var k = floorIndex(tl.time_us, t);
      cursor.style.left = Math.round(p.x) + "px";
      cursor.style.top = geom.yTop + "px";
      cursor.style.height = geom.yBase - geom.yTop + "px";
      cursor.hidden = false;
      showTooltip(evt, function (box) {
        box.appendChild(el("div", "mw-tip-head", fmtTime(tl.time_us[k])));
        row(box, null, "total", fmtBytes(tl.total[k]));
        tl.series
          .slice()
          .reverse()
          .forEach(function (s) {
            if (state.hidden[s.name]) return;
            row(box, data.palette[state.by][s.name], s.name, fmtBytes(s.values[k]));
          });
      });
    });
    tlCanvas.addEventListener("mouseleave", function () {
      hideHover();
    });
    function markerAt(p) {
      var hit = null;
      drawn.boxes.forEach(function (b) {
        if (Math.abs(b.x - p.x) <= 9 && Math.abs(b.y - p.y) <= 9) hit = data.markers[b.i];
      });
      return hit;
    }
    tlCanvas.addEventListener("click", function (evt) {
      var hit = markerAt(localX(evt, tlCanvas));
      if (hit && hit.anchor) {
        var target = document.getElementById(hit.anchor);
        if (target) target.scrollIntoView();
        status.setAttribute("data-followed", hit.anchor);
      }
    });
    // A finding's "show the evidence on the timeline": zoom to its markers and label them.
    function focusFinding(n) {
      var ts = (data.markers || []).filter(function (m) { return m.finding === n; }).map(function (m) { return m.time_us; });
      if (!ts.length) return;
      var lo = Math.min.apply(null, ts), hi = Math.max.apply(null, ts);
      var pad = Math.max((hi - lo) * 0.15, (full[1] - full[0]) * 0.04);
      state.view = [Math.max(full[0], lo - pad), Math.min(full[1], hi + pad)];
      state.focus = n;
      redraw();
      document.getElementById("timeline").scrollIntoView();
    }
    Array.prototype.forEach.call(document.querySelectorAll("a.mw-goto"), function (a) {
      a.addEventListener("click", function (evt) {
        evt.preventDefault();
        focusFinding(Number(a.getAttribute("data-finding")));
      });
    });
    if (baseBtn) {
      baseBtn.hidden = !data.baseline_bytes;
      baseBtn.addEventListener("click", function () {
        state.baseline = !state.baseline;
        redraw();
      });
    }
    tlCanvas.addEventListener("mousedown", function (evt) {
      if (!geom) return;
      drag = localX(evt, tlCanvas).x;
      evt.preventDefault();
    });
    window.addEventListener("mouseup", function (evt) {
      if (drag === null || !geom) return;
      var x = localX(evt, tlCanvas).x;
      var a = Math.max(M.l, Math.min(drag, x)),
        b = Math.min(geom.w - M.r, Math.max(drag, x));
      drag = null;
      selection.hidden = true;
      if (b - a < 5) return;
      var t0 = tOf(a, geom.w),
        t1 = tOf(b, geom.w);
      state.view = [t0, Math.max(t1, t0 + 1)];
      redraw();
    });
    function resetZoom() {
      state.view = null;
      state.focus = 0;
      redraw();
    }
    tlCanvas.addEventListener("dblclick", resetZoom);
    lnCanvas.addEventListener("dblclick", resetZoom);
    resetBtn.addEventListener("click", resetZoom);

    lnCanvas.addEventListener("mousemove", function (evt) {
      var p = localX(evt, lnCanvas);
      var w = lnCanvas.clientWidth;
      var r = Math.floor((p.y - 8) / ROW);
      if (p.x < M.l || p.x > w - M.r || r < 0 || r >= nRows) {
        hideHover();
        return;
      }
      var t = tOf(p.x, w);
      var slack = (2 / (w - M.l - M.r)) * (view()[1] - view()[0]); // 2 px either side
      if (phaseRow && r === 0) {
        var ph = null;
        lanes.phases.forEach(function (q) {
          if (q.start - slack <= t && t <= q.end + slack) ph = q;
        });
        if (!ph) return hideHover();
        showTooltip(evt, function (box) {
          box.appendChild(el("div", "mw-tip-head", ph.name));
          row(box, data.palette.phase[ph.phase], "phase", ph.phase);
          row(box, null, "start", fmtTime(ph.start));
          row(box, null, "duration", fmtTime(ph.end - ph.start));
        });
        return;
      }
      var best = -1;
      rowsByLane[r].forEach(function (k) {
        if (mod.start[k] - slack <= t && t <= mod.end[k] + slack) {
          if (best < 0 || mod.end[k] - mod.start[k] < mod.end[best] - mod.start[best]) best = k;
        }
      });
      if (best < 0) return hideHover();
      showTooltip(evt, function (box) {
        box.appendChild(el("div", "mw-tip-head mw-path", lanes.strings[mod.name[best]] || "(unnamed)"));
        row(box, data.palette.modality[mod.modality[best]], "modality", mod.modality[best]);
        row(box, data.palette.phase[mod.phase[best]], "phase", mod.phase[best]);
        row(box, null, "start", fmtTime(mod.start[best]));
        row(box, null, "duration", fmtTime(mod.end[best] - mod.start[best]));
        row(box, null, "fingerprint", mod.fp[best] >= 0 ? lanes.strings[mod.fp[best]] : "—");
      });
    });
    lnCanvas.addEventListener("mouseleave", hideHover);

    var stackButtons = document.querySelectorAll(".mw-stack button");
    function markStack() {
      Array.prototype.forEach.call(stackButtons, function (b) {
        b.classList.toggle("on", b.getAttribute("data-by") === state.by);
      });
    }
    Array.prototype.forEach.call(stackButtons, function (btn) {
      btn.addEventListener("click", function () {
        state.by = btn.getAttribute("data-by");
        state.hidden = {};
        markStack();
        try {
          window.history.replaceState(null, "", "#by=" + state.by); // a link reopens this stacking
        } catch (e) {
          /* some file:// contexts refuse; the switch still works */
        }
        buildLegend();
        drawTimeline();
        publish();
      });
    });
    markStack();

    function publish() {
      status.setAttribute("data-series", String(drawn.series));
      status.setAttribute("data-points", String(drawn.points));
      status.setAttribute("data-spans", String(drawn.spans));
      status.setAttribute("data-by", state.by);
      status.setAttribute("data-baseline", String(drawn.base || 0));
      status.setAttribute("data-focus", String(state.focus));
      var v = view();
      status.setAttribute("data-view", Math.round(v[0]) + "," + Math.round(v[1]));
      if (baseBtn) baseBtn.textContent = state.baseline ? "y: above weights" : "y: from zero";
      var rect = tlCanvas.getBoundingClientRect();
      status.setAttribute("data-plot-x", String(Math.round(rect.left + window.scrollX + M.l)));
      status.setAttribute("data-plot-y", String(Math.round(rect.top + window.scrollY + M.t)));
      status.setAttribute("data-plot-w", String(Math.round(rect.width - M.l - M.r)));
      status.setAttribute("data-plot-h", String(Math.round(rect.height - M.t - M.b)));
    }

    function redraw() {
      resetBtn.hidden = !state.view;
      hideHover();
      drawTimeline();
      drawLanes();
      publish();
    }

    var resizeTimer = null;
    window.addEventListener("resize", function () {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(redraw, 100);
    });

    buildLegend();
    redraw();
    document.body.dataset.rendered = "1";
  }
})();
