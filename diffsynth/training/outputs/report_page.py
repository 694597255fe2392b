"""The style and script of ``logs/report.html`` (:mod:`diffsynth.training.outputs.run_report`), inlined in every page.

The page must open from ``file://`` with nothing on the network, so nothing is linked: the CSS and the JavaScript below
are written into the page itself, and the charts are SVG the script draws from the page's ``run-data`` JSON. The script
also turns times into "2 min ago" and reloads a running page every :data:`RELOAD_SECONDS` (keeping the scroll position
and the open ``<details>``); a finished, failed or stopped page stays still.
"""

from __future__ import annotations

#: How often a running page reloads itself.
RELOAD_SECONDS = 10

STYLE = """
:root{--bg:#f6f7f9;--card:#fff;--text:#1d2330;--muted:#5d6675;--line:#e3e6ec;--loss:#9dbbe6;--avg:#1a4fa3;
--val:#d9480f;--prior:#9c36b5;--lr:#2b8a3e;--running:#1864ab;--finished:#2b8a3e;--failed:#c92a2a;--stopped:#e67700}
@media (prefers-color-scheme:dark){:root{--bg:#15181e;--card:#1f232b;--text:#e6e9ef;--muted:#9aa3b2;
--line:#323844;--loss:#3d5a85;--avg:#8fb8ff;--val:#ff8c5a;--prior:#da77f2;--lr:#69db7c}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--text);font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{padding:16px 20px 8px;display:flex;flex-wrap:wrap;gap:8px 16px;align-items:baseline}
h1{font-size:1.3em;margin:0;word-break:break-all}
h2{font-size:1em;margin:0 0 8px;color:var(--muted);font-weight:600}
main{padding:8px 20px 32px;display:grid;gap:16px;grid-template-columns:repeat(auto-fit,minmax(min(100%,420px),1fr))}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px;min-width:0}
.wide{grid-column:1/-1}
.status{display:inline-block;padding:2px 10px;border-radius:999px;color:#fff;font-weight:600;font-size:.9em}
.status.running{background:var(--running)}.status.finished{background:var(--finished)}
.status.failed{background:var(--failed)}.status.stopped{background:var(--stopped)}
.muted{color:var(--muted)}
.error{color:var(--failed);font-weight:600;white-space:pre-wrap;word-break:break-word;margin:4px 0 0;flex-basis:100%}
.stats{display:grid;gap:10px;grid-template-columns:repeat(auto-fit,minmax(140px,1fr))}
.stat b{display:block;font-size:1.35em;font-variant-numeric:tabular-nums}
.stat span{color:var(--muted);font-size:.85em}
.bar{height:6px;border-radius:3px;background:var(--line);margin-top:10px;overflow:hidden}
.bar div{height:100%;background:var(--running)}
svg.chart{width:100%;height:auto;display:block;touch-action:pan-y}
svg.chart text{fill:var(--muted);font-size:12px}
svg.chart .grid{stroke:var(--line)}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:.85em;color:var(--muted)}
.legend i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin-right:5px}
.samples{display:grid;gap:10px;grid-template-columns:repeat(auto-fill,minmax(min(100%,200px),1fr))}
figure{margin:0}
figure img,figure video{width:100%;height:auto;border-radius:6px;background:var(--line);display:block}
figcaption{font-size:.85em;color:var(--muted);margin-top:4px;word-break:break-word}
details{margin-top:10px}summary{cursor:pointer;color:var(--muted)}
table{border-collapse:collapse;width:100%;font-size:.85em}
td{border-top:1px solid var(--line);padding:3px 6px;vertical-align:top;word-break:break-all}
td:first-child{white-space:nowrap;color:var(--muted);word-break:normal}
@media (max-width:520px){header,main{padding-left:10px;padding-right:10px}.card{padding:10px}}
"""

SCRIPT = """
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function movingAverage(points) {
    const window = Math.max(1, Math.min(100, Math.floor(points.length / 10)));
    const out = [];
    let total = 0, count = 0;
    points.forEach(function (point, index) {
      if (point[1] !== null) { total += point[1]; count += 1; }
      const old = index >= window ? points[index - window][1] : null;
      if (old !== null) { total -= old; count -= 1; }
      out.push([point[0], count ? total / count : null]);
    });
    return out;
  }
  function ticks(low, high, count) {
    if (!(high > low)) return [low];
    const raw = (high - low) / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(function (m) { return m * power; }).find(function (s) { return s >= raw; });
    const out = [];
    for (let value = Math.ceil(low / step) * step; value <= high + step * 1e-9; value += step) out.push(value);
    return out;
  }
  function label(value) {
    if (value === 0) return "0";
    const size = Math.abs(value);
    return size >= 1e4 || size < 1e-3 ? value.toExponential(1) : String(+value.toPrecision(4));
  }
  function path(points, x, y) {
    let d = "", pen = false;
    points.forEach(function (point) {
      if (point[1] === null) { pen = false; return; }
      d += (pen ? "L" : "M") + x(point[0]).toFixed(1) + " " + y(point[1]).toFixed(2);
      pen = true;
    });
    return d;
  }
  function draw(svg, series, height) {
    // The drawing's units are the element's pixels, so labels keep their size on a phone.
    const width = Math.max(280, Math.round(svg.getBoundingClientRect().width) || 900);
    const left = 64, right = 16, top = 10, bottom = 30;
    height = width < 600 ? Math.round(height * 0.75) : height;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    const all = [].concat.apply([], series.map(function (s) { return s.points; }));
    const values = all.map(function (p) { return p[1]; }).filter(function (v) { return v !== null; });
    if (!values.length) {
      el("text", {x: width / 2, y: height / 2, "text-anchor": "middle"}, svg).textContent = "no values yet";
      return;
    }
    const steps = all.map(function (p) { return p[0]; });
    let x0 = Math.min.apply(null, steps), x1 = Math.max.apply(null, steps);
    let y0 = Math.min.apply(null, values), y1 = Math.max.apply(null, values);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const x = function (v) { return left + (v - x0) / (x1 - x0) * (width - left - right); };
    const y = function (v) { return top + (y1 - v) / (y1 - y0) * (height - top - bottom); };
    ticks(y0, y1, 5).forEach(function (v) {
      el("line", {x1: left, x2: width - right, y1: y(v), y2: y(v), "class": "grid"}, svg);
      el("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end"}, svg).textContent = label(v);
    });
    ticks(x0, x1, 6).filter(function (v) { return Math.round(v) === v; }).forEach(function (v) {
      el("text", {x: x(v), y: height - 10, "text-anchor": "middle"}, svg).textContent = String(v);
    });
    series.forEach(function (s) {
      el("path", {d: path(s.points, x, y), fill: "none", stroke: s.colour, "stroke-width": s.width,
                  "data-series": s.name, "stroke-linejoin": "round"}, svg);
      if (s.dots) s.points.forEach(function (p) {
        if (p[1] !== null) el("circle", {cx: x(p[0]), cy: y(p[1]), r: 3.5, fill: s.colour}, svg);
      });
    });
    hover(svg, series, x, y, x0, x1, width, left, right, top, height - bottom);
  }
  function hover(svg, series, x, y, x0, x1, width, left, right, top, base) {
    const cursor = el("line", {y1: top, y2: base, stroke: "currentColor", opacity: 0, "stroke-dasharray": "3 3"}, svg);
    const tip = el("text", {x: left + 8, y: top + 14, opacity: 0}, svg);
    svg.addEventListener("mousemove", function (event) {
      const box = svg.getBoundingClientRect();
      const px = (event.clientX - box.left) / box.width * width;
      const step = Math.round(x0 + (px - left) / (width - left - right) * (x1 - x0));
      const parts = ["step " + step];
      series.forEach(function (s) {
        const hit = s.points.find(function (p) { return p[0] === step; });
        if (hit && hit[1] !== null) parts.push(s.name + " " + label(hit[1]));
      });
      cursor.setAttribute("x1", x(step)); cursor.setAttribute("x2", x(step)); cursor.setAttribute("opacity", 0.5);
      tip.textContent = parts.join("  \\u00b7  "); tip.setAttribute("opacity", 1);
    });
    svg.addEventListener("mouseleave", function () {
      cursor.setAttribute("opacity", 0); tip.setAttribute("opacity", 0);
    });
  }
  const css = getComputedStyle(document.documentElement);
  const colour = function (name) { return css.getPropertyValue(name).trim(); };
  const lossChart = document.getElementById("loss-chart");
  if (lossChart) draw(lossChart, [
    {name: "loss", points: data.loss, colour: colour("--loss"), width: 1.2},
    {name: "moving average", points: movingAverage(data.loss), colour: colour("--avg"), width: 2.4},
    {name: "val_loss", points: data.val_loss, colour: colour("--val"), width: 2, dots: true},
    {name: "loss_prior", points: data.loss_prior || [], colour: colour("--prior"), width: 1.2}
  ], 320);
  const lrChart = document.getElementById("lr-chart");
  if (lrChart) draw(lrChart, [{name: "lr", points: data.lr, colour: colour("--lr"), width: 2}], 160);
  function ago(seconds) {
    if (seconds < 90) return Math.max(0, Math.round(seconds)) + " s ago";
    if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
    return Math.round(seconds / 3600) + " h ago";
  }
  const updated = document.getElementById("updated");
  const tick = function () {
    if (updated) updated.textContent = ago((Date.now() - Date.parse(data.updated_at)) / 1000);
  };
  tick(); setInterval(tick, 1000);
  const key = "diffsynth-report:" + location.pathname;
  try {
    const saved = JSON.parse(sessionStorage.getItem(key) || "null");
    if (saved) {
      saved.open.forEach(function (id) { const node = document.getElementById(id); if (node) node.open = true; });
      window.scrollTo(0, saved.scroll);
    }
  } catch (error) { /* storage off (private mode): nothing kept across reloads */ }
  if (data.status === "running") setTimeout(function () {
    try {
      const open = Array.prototype.map.call(document.querySelectorAll("details[open][id]"), function (d) { return d.id; });
      sessionStorage.setItem(key, JSON.stringify({scroll: window.scrollY, open: open}));
    } catch (error) { /* as above */ }
    location.reload();
  }, RELOAD_MS);
})();
"""
