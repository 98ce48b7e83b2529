"""Write `plots/*.png` and `report.html` for a run directory.

Reads `metrics.jsonl` and `eval/*.json` from the run directory; it can be
re-run at any time (`temper report RUN`) and does not touch anything else.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from temper.monitor.sinks import read_jsonl


def _load_evals(run_dir: Path) -> list[dict[str, Any]]:
    evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
    return sorted(evals, key=lambda e: e["step"])


def write_plots(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    evals = _load_evals(run_dir)
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    steps = [m["step"] for m in metrics]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [m.get("reward_mean") for m in metrics], label="train reward (mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "reward.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [m.get("accuracy") for m in metrics], alpha=0.6, label="train accuracy")
    if evals:
        es = [e["step"] for e in evals]
        if all("accuracy" in e for e in evals):
            ax.plot(es, [e["accuracy"] for e in evals], "o-", label="held-out greedy")
        k = evals[0].get("k")
        if k and all(f"mean@{k}" in e for e in evals):
            ax.plot(es, [e[f"mean@{k}"] for e in evals], "s-", label=f"held-out mean@{k}")
    teacher = run_dir / "eval" / "teacher.json"  # a distillation run's teacher
    if teacher.is_file() and "accuracy" in (t := json.loads(teacher.read_text())):
        ax.axhline(t["accuracy"], ls="--", color="gray", label="teacher, held-out greedy")
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "accuracy.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    if any("kl" in m for m in metrics):
        paths.append(_reward_vs_kl(plt, metrics, out_dir / "reward_vs_kl.png"))
    return paths


def _reward_vs_kl(plt: Any, metrics: list[dict[str, Any]], path: Path) -> Path:
    """RLHF's frontier: each step's train reward against its KL to the reference policy
    (runs with ``algo.kl_coef`` > 0 log ``kl``: the mean per-token estimate)."""
    rows = [m for m in metrics if "kl" in m and "reward_mean" in m]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    points = ax.scatter([m["kl"] for m in rows], [m["reward_mean"] for m in rows],
                        c=[m["step"] for m in rows], cmap="viridis", s=14)  # fmt: skip
    fig.colorbar(points, ax=ax, label="step")
    ax.set_xlabel("KL to the reference, per token")
    ax.set_ylabel("train reward (mean)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: An eval's settings, not metrics (`temper.eval.harness.SETTINGS`): not table columns.
_EVAL_SETTINGS = ("n_tasks", "k", "temperature", "time_s", "step")


def _eval_table(evals: list[dict[str, Any]]) -> str:
    if not evals:
        return "<p>No evaluations were run.</p>"
    first = evals[0]
    keys = [k for k in first if isinstance(first[k], float) and k not in _EVAL_SETTINGS]
    caption = "accuracy, reward_mean: greedy (temperature 0)"
    if first.get("temperature") is not None and first.get("k") is not None:
        k = first["k"]
        caption += f"; pass@j, mean@{k}, maj@{k}, reward_mean@{k}: {k} samples at temperature "
        caption += f"{first['temperature']:g}"
    if first.get("correct_rule"):
        caption += f". Correct: {first['correct_rule']}"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["step", *keys])
    rows = []
    for e in evals:
        cells = "".join(f"<td>{e.get(k, float('nan')):.3f}</td>" for k in keys)
        rows.append(f"<tr><td>{e['step']}</td>{cells}</tr>")
    caption = f"<p>{html.escape(caption)}.</p>"
    return f"{caption}<table><tr>{head}</tr>{''.join(rows)}</table>"


def write_report(run_dir: Path) -> Path:
    """Render report.html (and the plots it embeds); returns its path."""
    write_plots(run_dir)
    evals = _load_evals(run_dir)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    summary = ""
    if len(evals) >= 2 and "accuracy" in evals[0]:
        first, last = evals[0], evals[-1]
        delta = 100 * (last["accuracy"] - first["accuracy"])
        summary = (
            f"<p class='big'>Held-out greedy accuracy: {100 * first['accuracy']:.1f}% "
            f"(step {first['step']}) &rarr; {100 * last['accuracy']:.1f}% "
            f"(step {last['step']}): <b>{delta:+.1f} points</b></p>"
        )
    config = (run_dir / "config.toml").read_text() if (run_dir / "config.toml").exists() else ""
    total_s = sum(m.get("time_step_s", 0.0) for m in metrics)
    kl_plot = ""
    if (run_dir / "plots" / "reward_vs_kl.png").exists() and any("kl" in m for m in metrics):
        kl_plot = '<img src="plots/reward_vs_kl.png">'
    if len(evals) >= 2 and "reward_mean" in evals[0]:
        first, last = evals[0], evals[-1]
        summary += (
            f"<p>Held-out reward (greedy): {first['reward_mean']:.3f} (step {first['step']}) "
            f"&rarr; {last['reward_mean']:.3f} (step {last['step']})</p>"
        )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Temper run {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
.big{{font-size:1.3em}}pre{{background:#f6f6f6;padding:1em;overflow:auto}}</style></head>
<body><h1>Run {html.escape(run_dir.name)}</h1>
{summary}
<p>{len(metrics)} steps logged, {total_s:.0f} s of step time.</p>
<h2>Evaluation (held-out)</h2>{_eval_table(evals)}
<h2>Plots</h2><img src="plots/reward.png"><img src="plots/accuracy.png">{kl_plot}
<h2>Config</h2><pre>{html.escape(config)}</pre>
</body></html>"""
    path = run_dir / "report.html"
    path.write_text(page)
    return path
