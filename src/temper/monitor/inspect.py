"""Look inside run directories: one step's best and worst samples; two runs side by side.

`list_steps` lists every step with saved samples. `inspect_step` reads
``trajectories/step_N.jsonl`` and prints the step's samples ranked by reward
(ties by advantage), with reward, advantage, length, prompt, target and
response. `compare_runs` prints a summary of each run's metrics (first,
last, min, max of each shared metric, and the final eval) and the config keys
that differ. Both only read files; they work on finished and running runs.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from temper.errors import ConfigError
from temper.monitor.sinks import read_jsonl

#: Metrics shown by `compare_runs` when both runs have them, in this order.
SUMMARY_KEYS = (
    "reward_mean", "accuracy", "entropy", "kl", "grad_norm", "response_len_mean",
    "train_infer_logprob_diff", "gen_tokens_per_s", "time_step_s",
)  # fmt: skip


def _run_dir(path: str | Path) -> Path:
    run = Path(path)
    if not (run / "metrics.jsonl").is_file():
        raise ConfigError(f"{run} is not a run directory (no metrics.jsonl)")
    return run


def _clip(text: Any, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _text(record: dict[str, Any], width: int) -> str:
    replies = [
        m.get("content") or "" for m in record.get("messages") or [] if m.get("role") == "assistant"
    ]
    text = " | ".join(replies) if replies else record.get("response_text", "")
    return _clip(text, width)


def _prompt(record: dict[str, Any]) -> str:
    """The task's prompt as written (multi-turn runs save the task), else the rendered one."""
    task = record.get("task") or {}
    prompt = task.get("prompt")
    if isinstance(prompt, list):  # chat messages
        return " | ".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return str(prompt) if prompt else str(record.get("prompt_text", ""))


def _target(record: dict[str, Any]) -> str:
    answer = record.get("answer")
    if answer is None:
        answer = (record.get("task") or {}).get("answer")
    if answer is not None:
        return str(answer)
    return "-" if "answer" in record else "- (not saved by this run)"


def _step_files(run: Path) -> dict[int, Path]:
    """Saved trajectory files by step, in step order."""
    found: dict[int, Path] = {}
    for p in (run / "trajectories").glob("step_*.jsonl"):
        number = p.stem.split("_", 1)[1]
        if number.isdigit():
            found[int(number)] = p
    return dict(sorted(found.items()))


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 5, 8, 9] -> "1-3, 5, 8-9"."""
    parts: list[str] = []
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(parts) or "none"


def list_steps(run: str | Path) -> str:
    """Every step with saved samples: count, mean reward, share correct."""
    files = _step_files(_run_dir(run))
    lines = [f"{len(files)} saved step(s): {_ranges(list(files))}"]
    for step, path in files.items():
        records = read_jsonl(path)
        rewards = [float(r.get("reward") or 0.0) for r in records]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        correct = sum(1 for r in records if r.get("correct"))
        lines.append(
            f"step {step:>6d}  samples {len(records):>4d}  reward mean {mean:+.3f}  "
            f"correct {correct}/{len(records)}"
        )
    return "\n".join(lines)


def inspect_step(run: str | Path, step: int, k: int = 3, width: int = 100) -> str:
    """The ``k`` best and ``k`` worst samples saved at ``step`` of ``run``, as text.

    Each sample shows its reward, advantage, length, finish reason, task id,
    prompt, target (the task's reference answer) and response.
    """
    files = _step_files(_run_dir(run))
    if step not in files:
        raise ConfigError(
            f"no trajectories saved at step {step}; saved steps: {_ranges(list(files))}"
        )
    records = read_jsonl(files[step])
    ranked = sorted(
        records, key=lambda r: (r.get("reward", 0.0), r.get("advantage", 0.0)), reverse=True
    )
    lines = [f"step {step}: {len(records)} saved samples"]
    for title, chosen in (("best", ranked[:k]), ("worst", ranked[::-1][:k])):
        lines.append(f"-- {title}")
        for r in chosen:
            tokens = sum(r.get("loss_mask") or [])
            lines.append(
                f"reward {r.get('reward', 0.0):+.3f}  adv {r.get('advantage', 0.0):+.3f}  "
                f"tokens {tokens:3d}  {r.get('finish_reason', '?'):8s} {r.get('task_id', '')}"
            )
            lines.append(f"    prompt:   {_clip(_prompt(r), width)}")
            lines.append(f"    target:   {_clip(_target(r), width)}")
            lines.append(f"    response: {_text(r, width)}")
    return "\n".join(lines)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _final_eval(run: Path) -> dict[str, Any]:
    evals = sorted((run / "eval").glob("step_*.json"))
    return json.loads(evals[-1].read_text()) if evals else {}


def compare_runs(a: str | Path, b: str | Path) -> str:
    """Metric summaries and the config diff of runs ``a`` and ``b``, as text."""
    runs = [_run_dir(a), _run_dir(b)]
    rows = [read_jsonl(r / "metrics.jsonl") for r in runs]
    lines = [
        f"{'':28s} {runs[0].name:>24s} {runs[1].name:>24s}",
        f"{'steps':28s} {len(rows[0]):>24d} {len(rows[1]):>24d}",
    ]
    for key in SUMMARY_KEYS:
        cells = []
        for metrics in rows:
            values = [m[key] for m in metrics if isinstance(m.get(key), int | float)]
            cells.append(f"{values[0]:.4g} -> {values[-1]:.4g}" if values else "-")
        if any(c != "-" for c in cells):
            lines.append(f"{key:28s} {cells[0]:>24s} {cells[1]:>24s}")
    evals = [_final_eval(r) for r in runs]
    for key in ("accuracy", "mean@4", "pass@4", "maj@4"):
        if any(key in e for e in evals):
            cells = [f"{e[key]:.4f}" if key in e else "-" for e in evals]
            lines.append(f"{'final eval ' + key:28s} {cells[0]:>24s} {cells[1]:>24s}")
    configs = []
    for r in runs:
        path = r / "config.toml"
        configs.append(_flatten(tomllib.loads(path.read_text())) if path.is_file() else {})
    diff = sorted(
        k for k in set(configs[0]) | set(configs[1]) if configs[0].get(k) != configs[1].get(k)
    )
    lines.append(f"config: {len(diff)} key(s) differ")
    for key in diff:
        lines.append(f"  {key}: {configs[0].get(key, '-')!r} vs {configs[1].get(key, '-')!r}")
    return "\n".join(lines)
