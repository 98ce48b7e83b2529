// Trajectory browser: the samples saved for one step, their turns, tool calls,
// rewards, images, and a heat map over the response tokens (see docs/dashboard.md).
"use strict";

(() => {
  const { state, api, runUrl, h, fmt, fillRunSelect } = Temper;
  const $ = (id) => document.getElementById(id);
  const tb = { run: "", steps: [], step: null, follow: true, samples: [], selected: null, loading: false };
  const FIELD_HELP = {
    behaviour_logprob: "white: the engine was sure (p = 1); red: an unlikely token (p → 0)",
    trainer_logprob: "white: p = 1; red: p → 0",
    advantage: "green: positive advantage, red: negative (scaled to this sample's largest |value|)",
    mismatch: "trainer − behaviour logprob: green above 0, red below (scaled to the largest |value|)",
    staleness: "orange: tokens from older policy versions",
  };

  const visible = () => !$("tab-trajectories").hidden;

  // Polled with the rest of the page; only asks the server while the tab is shown.
  async function refresh() {
    fillRunSelect($("traj-run"));
    if (!visible()) return;
    const run = $("traj-run").value;
    if (!run) return;
    if (run !== tb.run) {
      Object.assign(tb, { run, steps: [], step: null, follow: true, selected: null });
    }
    let summary;
    try {
      summary = await api(runUrl(run));
    } catch (err) {
      return showMessage(err.message);
    }
    const steps = summary.trajectory_steps;
    if (steps.join() !== tb.steps.join()) {
      tb.steps = steps;
      $("traj-step").replaceChildren(...steps.map((s) => h("option", { value: s }, `step ${s}`)));
    }
    const want = tb.follow || !steps.includes(tb.step) ? steps[steps.length - 1] : tb.step;
    if (want === undefined) return showMessage("this run has saved no trajectories yet");
    $("traj-step").value = String(want);
    if (want !== tb.step) {
      tb.step = want;
      await load();
    }
  }

  function query() {
    const q = new URLSearchParams();
    const add = (k, v) => v !== "" && v !== null && q.set(k, v);
    add("category", $("traj-category").value);
    add("min_reward", $("traj-min").value);
    add("max_reward", $("traj-max").value);
    add("correct", $("traj-correct").value);
    return q.toString();
  }

  async function load() {
    if (tb.step === null) return;
    if (tb.loading) {
      tb.again = true; // a filter changed mid-request: load once more when it ends
      return;
    }
    tb.loading = true;
    try {
      const r = await api(`${runUrl(tb.run)}/trajectories/${tb.step}?${query()}`);
      tb.samples = r.samples;
      tb.decodeError = r.decode_error;
      const cat = $("traj-category");
      const chosen = cat.value;
      cat.replaceChildren(h("option", { value: "" }, "all"),
        ...r.categories.map((c) => h("option", { value: c }, c)));
      cat.value = r.categories.includes(chosen) ? chosen : "";
      const range = r.reward_range ? `rewards ${fmt(r.reward_range[0])} … ${fmt(r.reward_range[1])}` : "";
      $("traj-summary").textContent =
        `step ${r.step}: ${r.samples.length} shown, ${r.matched} match the filters, ${r.total} saved  ${range}` +
        (r.errors.length ? `  (${r.errors.length} unreadable lines)` : "");
      if (!tb.samples.some((s) => s.index === tb.selected)) {
        tb.selected = tb.samples.length ? tb.samples[0].index : null;
      }
      renderList();
      renderDetail();
    } catch (err) {
      showMessage(err.message);
    } finally {
      tb.loading = false;
    }
    if (tb.again) {
      tb.again = false;
      await load();
    }
  }

  function showMessage(text) {
    $("traj-summary").textContent = text;
  }

  function renderList() {
    $("sample-list").replaceChildren(...tb.samples.map((s) =>
      h("li", {
        class: s.index === tb.selected ? "selected sample" : "sample",
        "data-index": s.index,
        onclick: () => {
          tb.selected = s.index;
          renderList();
          renderDetail();
        },
      },
      h("div", { class: "task" }, `#${s.index} ${s.task_id}`),
      h("div", {},
        h("span", { class: s.reward > 0 ? "good" : "bad" }, `reward ${fmt(s.reward)}`),
        ` · adv ${fmt(s.advantage)} · ${s.category}`,
        s.correct === null ? "" : h("span", { class: s.correct ? "good" : "bad" }, s.correct ? " ✓" : " ✗")),
      h("div", { class: "muted" },
        `${s.finish_reason} · ${s.num_turns} turn${s.num_turns === 1 ? "" : "s"} · ${s.response_tokens} tokens`))));
  }

  function renderDetail() {
    const s = tb.samples.find((x) => x.index === tb.selected);
    const box = $("sample-detail");
    if (!s) return box.replaceChildren(h("p", { class: "muted" }, "no sample matches the filters"));
    const comps = Object.entries(s.reward_components).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    box.replaceChildren(
      h("div", { class: "card sample-head", "data-index": s.index },
        h("b", {}, s.task_id), ` group ${s.group_id} · ${s.category} · reward `,
        h("b", { class: "sample-reward", "data-value": String(s.reward) }, fmt(s.reward)),
        comps ? ` (${comps})` : "", ` · advantage ${fmt(s.advantage)} · ${s.finish_reason}`,
        h("div", { class: "muted" },
          `${s.prompt_tokens} prompt + ${s.response_tokens} response tokens (${s.policy_tokens} sampled)`),
        s.reward_error ? h("div", { class: "bad" }, `reward error: ${s.reward_error}`) : "",
        s.env_error ? h("div", { class: "bad" }, `env error: ${s.env_error}`) : ""),
      h("h3", {}, "Turns"),
      ...s.turns.map(turnView),
      h("h3", {}, "Response tokens"),
      heatmap(s));
  }

  function turnView(t) {
    const reward = t.reward === undefined || t.reward === null ? "" : `reward ${fmt(t.reward)}`;
    return h("div", { class: `turn ${t.role}` },
      h("div", { class: "role" }, h("span", {}, t.name ? `${t.role} (${t.name})` : t.role), h("span", {}, reward)),
      ...(t.parts ? t.parts.map(partView) : [h("pre", {}, t.content)]),
      ...(t.tool_calls || []).map((c) =>
        h("span", { class: "tool-call" }, `${c.name}(${JSON.stringify(c.arguments)})`)),
      ...(t.tool_call_errors || []).map((e) =>
        h("span", { class: "tool-call error" }, `${e.kind}: ${e.message}`)));
  }

  // A turn's text or image part (turns that show images come as parts, in reading order).
  function partView(p) {
    return p.type === "image" ? h("div", { class: "turn-image" }, picture(p, "turn")) : h("pre", {}, p.text);
  }

  // An image from the run's store, linked to itself (click: full size in a new tab). Tiny
  // procedural pictures (64 px) are scaled up by a whole factor so their pixels stay sharp.
  function picture(p, where) {
    const img = h("img", { src: p.url, alt: `image ${p.sha256.slice(0, 12)}`, "data-sha256": p.sha256 });
    if (where === "turn") {
      img.addEventListener("load", () => {
        const w = img.naturalWidth;
        if (w > 0 && w < 128) {
          img.style.width = `${w * Math.ceil(128 / w)}px`;
          img.style.imageRendering = "pixelated";
        }
      });
    }
    return h("a", { href: p.url, target: "_blank", rel: "noopener", title: `image ${p.sha256}` }, img);
  }

  // Background for one value: see FIELD_HELP for what each colour means.
  function colour(field, v, scale) {
    if (v === null || v === undefined) return "";
    if (field.endsWith("logprob")) return `rgba(224,49,49,${(0.85 * (1 - Math.exp(v))).toFixed(3)})`;
    if (field === "staleness") return v > 0 ? `rgba(247,103,7,${Math.min(0.85, v / 4).toFixed(3)})` : "";
    const a = Math.min(1, Math.abs(v) / scale) * 0.85;
    return v >= 0 ? `rgba(47,158,68,${a.toFixed(3)})` : `rgba(224,49,49,${a.toFixed(3)})`;
  }

  function heatmap(s) {
    const field = $("traj-field").value;
    const tok = s.tokens;
    const values = tok.fields[field];
    const finite = (values || []).filter((v) => v !== null);
    const scale = Math.max(...finite.map(Math.abs), 1e-9);
    const notes = [];
    if (!values) notes.push(s.missing_fields[field] || `this sample has no ${field} field`);
    if (!tok.text) notes.push(`token text unavailable (${tb.decodeError || "not decoded"}): showing ids`);
    const names = Object.keys(tok.fields);
    // An image's run of image tokens is drawn as one picture, not 16+ identical tokens.
    const chips = new Map((tok.images || []).map((c) => [c.start, c]));
    const spans = [];
    for (let i = 0; i < tok.ids.length; i++) {
      const chip = chips.get(i);
      if (chip) {
        spans.push(h("span", {
          class: "tok obs image", "data-i": i, "data-length": chip.length,
          title: `#${i}…${i + chip.length - 1}: image ${chip.sha256.slice(0, 12)} (${chip.length} image tokens, mask 0)`,
        }, picture(chip, "token")));
        i += chip.length - 1;
        continue;
      }
      spans.push(tokenSpan(tok, i, names, field, values, scale));
    }
    return h("div", {},
      h("div", { class: "scale" }, h("b", {}, field), h("span", { class: "muted" }, FIELD_HELP[field] || ""),
        finite.length ? h("span", {}, `range ${fmt(Math.min(...finite))} … ${fmt(Math.max(...finite))}`) : ""),
      ...notes.map((n) => h("p", { class: "note" }, n)),
      h("div", { class: "heatmap", "data-field": field, "data-tokens": tok.ids.length }, ...spans),
      h("p", { class: "muted" }, "grey tokens: observations and template tokens (loss mask 0); hover a token for all its values"));
  }

  function tokenSpan(tok, i, names, field, values, scale) {
    const id = tok.ids[i];
    const piece = tok.text ? tok.text[i] : `[${id}]`;
    const cls = ["tok"];
    if (!tok.mask[i]) cls.push("obs"); // observation / template tokens: not trained on
    if (tok.turn[i] >= 0 && (i === 0 || tok.turn[i - 1] !== tok.turn[i])) cls.push("turn-start");
    const tip = [`#${i} id ${id}`, `mask ${tok.mask[i]}`, ...names.map((n) => `${n} ${fmt(tok.fields[n][i])}`)];
    return h("span", {
      class: cls.join(" "), "data-i": i, title: tip.join("\n"),
      style: values && tok.mask[i] ? `background:${colour(field, values[i], scale)}` : undefined,
    }, piece.replace(/\n/g, "↵\n"));
  }

  function start() {
    $("traj-run").addEventListener("change", refresh);
    $("traj-step").addEventListener("change", () => {
      tb.step = Number($("traj-step").value);
      tb.follow = tb.step === tb.steps[tb.steps.length - 1];
      load();
    });
    for (const id of ["traj-category", "traj-min", "traj-max", "traj-correct"]) $(id).addEventListener("change", load);
    $("traj-field").addEventListener("change", renderDetail);
    state.listeners.push(refresh);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
