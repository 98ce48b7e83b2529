// Temper dashboard: runs, metric charts, step-time breakdown and alerts.
// Polls the JSON API (see docs/dashboard.md) and redraws what changed.
// URL parameters: ?runs=a,b (selected runs) &metrics=x,y (charts) &poll=ms; #tab.
"use strict";

const Temper = (() => {
  const params = new URLSearchParams(location.search);
  const PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad", "#f08c00", "#5c940d"];
  const STAGES = [
    { key: "time_generate_s", name: "generate", color: "#4c6ef5" },
    { key: "time_reward_s", name: "reward", color: "#f59f00" },
    { key: "time_train_s", name: "train", color: "#37b24d" },
    { key: "time_weight_sync_s", name: "weight sync", color: "#ae3ec9" },
  ];
  const DEFAULT_CHARTS = ["reward_mean", "accuracy", "loss", "response_len_mean"];
  const state = {
    runs: [], // from /api/runs
    selected: new Set(params.get("runs") ? params.get("runs").split(",") : []),
    data: {}, // run -> {metrics: [], next, events: [], eventsNext, evals: []}
    charts: params.get("metrics") ? params.get("metrics").split(",") : null,
    pollMs: Number(params.get("poll")) || 0,
    colors: {},
    defaulted: false, // the default selection (all runs that did not fail) has been made
    listeners: [], // called after every poll (the trajectory browser)
  };
  const $ = (id) => document.getElementById(id);
  const fmt = TemperCharts.fmt;

  async function api(path) {
    const res = await fetch(path, { cache: "no-store" });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(body.detail || `${res.status} ${path}`);
    return body;
  }
  const runUrl = (name) => `/api/runs/${encodeURIComponent(name)}`;

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
    }
    for (const c of children.flat()) node.append(c instanceof Node ? c : String(c ?? ""));
    return node;
  }

  // The n-th colour handed out: the palette first, then hues a golden angle apart, with
  // lightness stepped on each turn of the wheel, so no two runs ever share a colour.
  function nthColor(n) {
    if (n < PALETTE.length) return PALETTE[n];
    const k = n - PALETTE.length;
    const hue = (k * 137.508 + 20) % 360;
    const light = 38 + ((Math.floor((k * 137.508) / 360) * 11) % 30);
    return `hsl(${hue.toFixed(2)}, 70%, ${light}%)`;
  }

  function colorOf(name) {
    if (!state.colors[name]) state.colors[name] = nthColor(Object.keys(state.colors).length);
    return state.colors[name];
  }

  // ---- polling -------------------------------------------------------------
  async function pollRun(name) {
    const d = (state.data[name] ||= { metrics: [], next: 0, events: [], eventsNext: 0, evals: [] });
    const [m, e, ev] = await Promise.all([
      api(`${runUrl(name)}/metrics?since=${d.next}`),
      api(`${runUrl(name)}/events?since=${d.eventsNext}`),
      api(`${runUrl(name)}/evals`),
    ]);
    // `reset`: the file was truncated (a resumed run): start over from what came back.
    d.metrics = m.reset ? m.records : d.metrics.concat(m.records);
    d.next = m.next;
    d.events = e.reset ? e.records : d.events.concat(e.records);
    d.eventsNext = e.next;
    d.evals = ev.evals;
  }

  async function poll() {
    try {
      const r = await api("/api/runs");
      state.runs = r.runs;
      $("runs-dir").textContent = r.runs_dir;
      const names = new Set(r.runs.map((x) => x.name));
      for (const name of [...state.selected]) if (!names.has(name)) state.selected.delete(name);
      // First poll with no ?runs=: every run but the failed ones (tick them to see them).
      if (!state.defaulted && !params.get("runs")) {
        r.runs.filter((x) => x.status !== "failed").forEach((x) => state.selected.add(x.name));
        state.defaulted = r.runs.length > 0;
      }
      // The step-time view may show a run that is not selected: keep it live too.
      const shown = new Set([...state.selected, $("time-run").value].filter((n) => names.has(n)));
      await Promise.all([...shown].map(pollRun));
      $("banner").hidden = true;
      $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      $("banner").hidden = false;
      $("banner").textContent = `Cannot read from the dashboard server: ${err.message}`;
    }
    render();
    for (const f of state.listeners) f();
  }

  // ---- rendering -------------------------------------------------------------
  function render() {
    renderRunList();
    renderMetrics();
    renderTime();
    renderAlerts();
  }

  function renderRunList() {
    const box = $("run-list");
    if (!state.runs.length) {
      box.replaceChildren(h("p", { class: "muted" }, "no run directories yet"));
      return;
    }
    box.replaceChildren(
      ...state.runs.map((r) =>
        h("label", { class: "run-item", "data-run": r.name },
          h("input", {
            type: "checkbox",
            checked: state.selected.has(r.name),
            onchange: (ev) => {
              if (ev.target.checked) state.selected.add(r.name);
              else state.selected.delete(r.name);
              poll();
            },
          }),
          h("span", { class: "swatch", style: `background:${colorOf(r.name)}` }),
          h("span", {}, r.name, h("span", { class: "muted" }, ` · ${r.steps} steps`),
            r.status === "failed" ? h("span", { class: "status-failed" }, " · failed") : "")),
      ),
    );
  }

  // Numeric series of one run: metrics.jsonl keys, and "eval:<key>" from eval/step_N.json.
  function series(name, key) {
    const d = state.data[name];
    if (!d) return [];
    const rows = key.startsWith("eval:") ? d.evals : d.metrics;
    const k = key.startsWith("eval:") ? key.slice(5) : key;
    return rows.filter((r) => k in r && typeof r.step === "number").map((r) => [r.step, r[k]]);
  }

  function metricKeys() {
    const keys = new Set();
    for (const name of state.selected) {
      const d = state.data[name];
      if (!d) continue;
      for (const r of d.metrics) for (const [k, v] of Object.entries(r)) {
        if (k !== "step" && (typeof v === "number" || v === null)) keys.add(k);
      }
      for (const e of d.evals) for (const [k, v] of Object.entries(e)) {
        if (k !== "step" && typeof v === "number") keys.add(`eval:${k}`);
      }
    }
    return [...keys].sort();
  }

  function renderMetrics() {
    const keys = metricKeys();
    if (state.charts === null && keys.length) {
      const defaults = DEFAULT_CHARTS.filter((k) => keys.includes(k));
      state.charts = defaults.length ? defaults : keys.slice(0, 4);
    }
    const select = $("metric-select");
    if (select.dataset.keys !== keys.join("\n")) {
      // Rebuilt only when the keys change, so an open picker is not closed by a poll.
      const chosen = select.value;
      select.replaceChildren(...keys.map((k) => h("option", { value: k }, k)));
      select.dataset.keys = keys.join("\n");
      if (keys.includes(chosen)) select.value = chosen;
    }
    const box = $("charts");
    box.replaceChildren(...(state.charts || []).map(chartCard));
    // Draw after the cards are in the page: the charts size themselves to their box.
    for (const card of box.children) drawChart(card);
  }

  function chartCard(key) {
    return h("div", { class: "card chart-card", "data-metric": key },
      h("h3", {}, h("span", {}, key),
        h("button", { type: "button", title: "remove chart", onclick: () => {
          state.charts = state.charts.filter((k) => k !== key);
          renderMetrics();
        } }, "×")),
      h("div", { class: "chart-area" }),
      h("div", { class: "legend" }));
  }

  function drawChart(card) {
    const key = card.dataset.metric;
    const runs = [...state.selected].filter((n) => state.data[n]);
    const lines = runs.map((n) => ({ name: n, color: colorOf(n), points: series(n, key) }));
    TemperCharts.lineChart(card.querySelector(".chart-area"), lines);
    card.querySelector(".legend").replaceChildren(
      ...lines.map((l) => {
        const last = l.points[l.points.length - 1];
        return h("span", {},
          h("span", { class: "swatch", style: `background:${l.color}` }), ` ${l.name} `,
          h("b", {
            class: "latest", "data-run": l.name, "data-metric": key,
            "data-step": last ? last[0] : "", "data-value": last ? String(last[1]) : "",
          }, last ? fmt(last[1]) : "–"),
          last ? h("span", { class: "muted" }, ` @${last[0]}`) : "");
      }));
  }

  function addChart() {
    const key = $("metric-select").value;
    if (!key) return;
    state.charts = (state.charts || []).filter((k) => k !== key).concat([key]);
    renderMetrics();
  }

  function fillRunSelect(select) {
    const names = state.runs.map((r) => r.name);
    const chosen = select.value;
    if (select.dataset.names !== names.join("\n")) {
      select.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
      select.dataset.names = names.join("\n");
    }
    const preferred = [...state.selected].find((n) => names.includes(n));
    select.value = names.includes(chosen) ? chosen : preferred || names[0] || "";
  }

  function renderTime() {
    fillRunSelect($("time-run"));
    const name = $("time-run").value;
    if (name && !state.data[name]) pollRun(name).then(renderTime).catch(() => {});
    const recs = ((state.data[name] || {}).metrics || []).slice(-200);
    const parts = recs.map((r) => {
      const staged = STAGES.map((s) => r[s.key] || 0);
      const other = (r.time_step_s || 0) - staged.reduce((a, b) => a + b, 0);
      return staged.concat([other > 0 ? other : 0]);
    });
    const stages = STAGES.concat([{ key: "other", name: "other", color: "#adb5bd" }]);
    $("time-legend").replaceChildren(...stages.map((s) =>
      h("span", {}, h("span", { class: "swatch", style: `background:${s.color}` }), ` ${s.name}`)));
    TemperCharts.stackedBars($("time-chart"), recs.map((r, i) => ({ x: r.step, parts: parts[i] })), stages);
    const table = $("time-table");
    if (!recs.length) return table.replaceChildren();
    const mean = (k) => parts.reduce((a, p) => a + p[k], 0) / parts.length;
    const total = stages.reduce((a, _, k) => a + mean(k), 0) || 1;
    const last = parts[parts.length - 1];
    table.replaceChildren(
      h("tr", {}, h("th", { class: "text" }, "stage"), h("th", {}, `step ${recs[recs.length - 1].step} (s)`),
        h("th", {}, `mean of ${recs.length} (s)`), h("th", {}, "share")),
      ...stages.map((s, k) => h("tr", { "data-stage": s.name },
        h("td", { class: "text" }, s.name), h("td", {}, fmt(last[k])),
        h("td", {}, fmt(mean(k))), h("td", {}, `${((100 * mean(k)) / total).toFixed(1)}%`))));
  }

  function renderAlerts() {
    const rows = [];
    for (const name of state.selected) {
      for (const e of (state.data[name] || {}).events || []) rows.push({ run: name, ...e });
    }
    rows.sort((a, b) => (b.step ?? -1) - (a.step ?? -1));
    const badge = $("alert-count");
    badge.textContent = rows.length;
    badge.classList.toggle("hot", rows.length > 0);
    const skip = new Set(["run", "step", "kind", "level", "severity", "message"]);
    $("alerts-table").replaceChildren(
      h("tr", {}, ...["run", "step", "kind", "level", "message / details"].map((t) =>
        h("th", { class: "text" }, t))),
      ...(rows.length ? rows.map((e) => {
        const level = e.level || e.severity || "";
        const details = Object.entries(e).filter(([k]) => !skip.has(k))
          .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join("  ");
        return h("tr", { class: `alert level-${level}` },
          h("td", { class: "text" }, e.run), h("td", {}, e.step ?? ""),
          h("td", { class: "text" }, e.kind || ""), h("td", { class: "text" }, level),
          h("td", { class: "text" }, [e.message, details].filter(Boolean).join("  ")));
      }) : [h("tr", {}, h("td", { class: "text", colspan: 5 }, "no alerts"))]));
  }

  // ---- tabs and start ------------------------------------------------------
  function showTab() {
    const tab = (location.hash || "#metrics").slice(1);
    for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== `tab-${tab}`;
    for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab);
    render(); // charts size to their (now visible) box
    for (const f of state.listeners) f();
  }

  async function start() {
    $("add-chart").addEventListener("click", addChart);
    $("time-run").addEventListener("change", renderTime);
    window.addEventListener("hashchange", showTab);
    window.addEventListener("resize", () => render());
    if (!state.pollMs) state.pollMs = (await api("/api/config").catch(() => ({}))).poll_ms || 3000;
    showTab();
    await poll();
    document.body.dataset.ready = "1"; // the first poll has been drawn (tests wait for it)
    // The next poll is scheduled after this one ends: slow reads never pile up.
    const loop = () => setTimeout(() => poll().finally(loop), state.pollMs);
    loop();
  }

  document.addEventListener("DOMContentLoaded", start);
  return { state, api, runUrl, h, fmt, colorOf, fillRunSelect };
})();
