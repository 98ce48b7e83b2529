// Tiny SVG charts for the Temper dashboard: a line chart and a stacked bar chart.
// No libraries and no build step: the page must work with no internet access.
"use strict";

const TemperCharts = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const M = { top: 10, right: 14, bottom: 26, left: 56 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  // "Nice" tick values covering [lo, hi] (1, 2, 5 x 10^k steps), as in most plotting libraries.
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / Math.max(count, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }

  // Short, stable number text for axes, legends and tables.
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (Number.isInteger(v) && Math.abs(v) < 1e7) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return String(Number(v.toPrecision(4)));
  }

  function domain(values, pad) {
    let lo = Math.min(...values);
    let hi = Math.max(...values);
    if (!Number.isFinite(lo)) return [0, 1];
    if (lo === hi) {
      const d = Math.abs(lo) * 0.1 || 1;
      return [lo - d, hi + d];
    }
    const d = (hi - lo) * pad;
    return [lo - d, hi + d];
  }

  function frame(container, height) {
    container.replaceChildren();
    const width = Math.max(container.clientWidth || 0, 320);
    const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "chart" });
    container.appendChild(svg);
    return { svg, w: width - M.left - M.right, h: height - M.top - M.bottom };
  }

  function axes(g, w, h, xs, ys, sx, sy) {
    for (const y of ticks(ys[0], ys[1], 5)) {
      el("line", { x1: 0, x2: w, y1: sy(y), y2: sy(y), class: "grid" }, g);
      el("text", { x: -6, y: sy(y) + 4, class: "tick", "text-anchor": "end" }, g).textContent = fmt(y);
    }
    for (const x of ticks(xs[0], xs[1], Math.max(2, Math.floor(w / 70)))) {
      const px = Number.isInteger(x) ? sx(x) : null; // steps are whole numbers
      if (px === null) continue;
      el("line", { x1: px, x2: px, y1: h, y2: h + 4, class: "axis" }, g);
      el("text", { x: px, y: h + 17, class: "tick", "text-anchor": "middle" }, g).textContent =
        fmt(x);
    }
    el("line", { x1: 0, x2: w, y1: h, y2: h, class: "axis" }, g);
  }

  // series: [{name, color, points: [[x, y], ...]}]; y may be null (a gap: NaN in the log).
  function lineChart(container, series, opts = {}) {
    const { svg, w, h } = frame(container, opts.height || 220);
    const finite = series.flatMap((s) => s.points.filter((p) => p[1] !== null && Number.isFinite(p[1])));
    if (!finite.length) {
      el("text", { x: 20, y: 40, class: "empty" }, svg).textContent = "no data yet";
      svg.dataset.points = "0";
      return svg;
    }
    const xs = domain(finite.map((p) => p[0]), 0);
    const ys = domain(finite.map((p) => p[1]), 0.06);
    const sx = (x) => (xs[1] === xs[0] ? w / 2 : ((x - xs[0]) / (xs[1] - xs[0])) * w);
    const sy = (y) => h - ((y - ys[0]) / (ys[1] - ys[0])) * h;
    const g = el("g", { transform: `translate(${M.left},${M.top})` }, svg);
    axes(g, w, h, xs, ys, sx, sy);
    let drawn = 0;
    for (const s of series) {
      let d = "";
      let pen = false;
      for (const [x, y] of s.points) {
        if (y === null || !Number.isFinite(y)) {
          pen = false;
          continue;
        }
        d += `${pen ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
        pen = true;
      }
      const n = s.points.filter((p) => p[1] !== null).length;
      el("path", { d, class: "line", stroke: s.color, "data-run": s.name, "data-n": n }, g);
      // Dots (with a hover title) while they stay legible; the path carries the rest.
      if (s.points.length <= 400) {
        for (const [x, y] of s.points) {
          if (y === null || !Number.isFinite(y)) continue;
          const c = el("circle", { cx: sx(x), cy: sy(y), r: 2.4, fill: s.color, class: "pt" }, g);
          el("title", {}, c).textContent = `${s.name}  step ${x}: ${fmt(y)}`;
        }
      }
      drawn += n;
    }
    svg.dataset.points = String(drawn);
    return svg;
  }

  // rows: [{x, parts: [v per stage]}], stages: [{name, color}]: one stacked bar per row.
  function stackedBars(container, rows, stages, opts = {}) {
    const { svg, w, h } = frame(container, opts.height || 240);
    if (!rows.length) {
      el("text", { x: 20, y: 40, class: "empty" }, svg).textContent = "no steps yet";
      return svg;
    }
    const totals = rows.map((r) => r.parts.reduce((a, b) => a + Math.max(b || 0, 0), 0));
    const ys = [0, Math.max(...totals) * 1.05 || 1];
    const band = w / rows.length;
    const sy = (y) => h - (y / ys[1]) * h;
    const g = el("g", { transform: `translate(${M.left},${M.top})` }, svg);
    axes(g, w, h, [rows[0].x, rows[rows.length - 1].x], ys, (x) => {
      const i = rows.findIndex((r) => r.x === x);
      return i < 0 ? null : i * band + band / 2;
    }, sy);
    rows.forEach((r, i) => {
      let base = 0;
      r.parts.forEach((v, k) => {
        v = Math.max(v || 0, 0);
        if (!v) return;
        const rect = el("rect", {
          x: i * band + band * 0.1,
          width: Math.max(band * 0.8, 1),
          y: sy(base + v),
          height: Math.max(sy(base) - sy(base + v), 0.5),
          fill: stages[k].color,
          class: "bar",
          "data-stage": stages[k].name,
        }, g);
        el("title", {}, rect).textContent = `step ${r.x} ${stages[k].name}: ${fmt(v)} s`;
        base += v;
      });
    });
    svg.dataset.bars = String(rows.length);
    return svg;
  }

  return { lineChart, stackedBars, fmt, ticks };
})();
