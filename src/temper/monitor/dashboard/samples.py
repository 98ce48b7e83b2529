"""Trajectory records → what the trajectory browser shows.

One record of `trajectories/step_N.jsonl` (a `Trajectory.to_json()`) becomes a
sample view: its turns (chat messages for env episodes, prompt and response
text for single-turn samples) with parsed tool calls and per-turn rewards,
and its response tokens with per-token fields for the heat map.

Per-token fields: `behaviour_logprob` (the engine's logprob, policy tokens
only), `advantage` (the record's `token_advantages`, one per token, when it
has them (turn-level credit), else the sample's scalar advantage on every
policy token: what the loss uses), `version` and `staleness`. When a record carries
`trainer_logprobs` (the trainer's recomputed logprob per response token) the
view also has `trainer_logprob` and `mismatch` = trainer − behaviour logprob,
the per-token train/inference mismatch. Today's trajectories do not record
it (only the step's `train_infer_logprob_diff` metrics); the view lists it
under `missing_fields` with the reason, and the page says so.

Vision runs: a turn that shows images also has `parts` (its text and images
in reading order, each image with its URL), and `tokens.images` marks each
image's run of image tokens in the response, drawn as one picture
(`temper.monitor.dashboard.images`). Text-only samples have neither.
"""

from __future__ import annotations

import json
import math
import threading
import tomllib
from pathlib import Path
from typing import Any

from temper.models.tool_calls import parse_tool_calls
from temper.monitor.dashboard.images import (
    ImageLinks,
    message_parts,
    prompt_parts,
    response_chips,
)

MISMATCH_MISSING = (
    "per-token train/inference mismatch needs a `trainer_logprobs` field on the "
    "trajectory record; this run does not record it (see the step metric "
    "train_infer_logprob_diff)"
)


def load_samples(
    path: Path, step: int, links: ImageLinks | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every record of a trajectories file as a sample view, plus per-line errors."""
    samples, errors = [], []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                errors.append(f"{path.name} line {lineno}: not JSON ({exc})")
                continue
            samples.append(sample_view(record, index=len(samples), step=step, links=links))
    return samples, errors


def filter_samples(
    samples: list[dict[str, Any]],
    min_reward: float | None = None,
    max_reward: float | None = None,
    category: str | None = None,
    correct: bool | None = None,
) -> list[dict[str, Any]]:
    """Samples whose reward lies in [min_reward, max_reward] and that match the others."""
    out = []
    for s in samples:
        r = s["reward"]
        if min_reward is not None and (r is None or r < min_reward):
            continue
        if max_reward is not None and (r is None or r > max_reward):
            continue
        if category and s["category"] != category:
            continue
        if correct is not None and s["correct"] is not correct:
            continue
        out.append(s)
    return out


def sample_view(
    record: dict[str, Any], index: int, step: int, links: ImageLinks | None = None
) -> dict[str, Any]:
    """One trajectory record as the browser shows it (see the module docstring)."""
    links = links or ImageLinks()
    response = list(record.get("response_ids") or [])
    reward = _finite(record.get("reward"))
    return {
        "index": index,
        "task_id": record.get("task_id", ""),
        "group_id": record.get("group_id"),
        "category": record.get("category", "default"),
        "reward": reward,
        "reward_components": record.get("reward_components") or {},
        "reward_error": record.get("reward_error"),
        "correct": record.get("correct"),
        "advantage": _finite(record.get("advantage")),
        "finish_reason": record.get("finish_reason", ""),
        "num_turns": record.get("num_turns", 1),
        "turn_rewards": record.get("turn_rewards") or [],
        "env_error": record.get("env_error"),
        "prompt_tokens": len(record.get("prompt_ids") or []),
        "response_tokens": len(response),
        "policy_tokens": sum(record.get("loss_mask") or []),
        "turns": turns(record, links),
        **token_fields(record, step, links),
    }


def turns(record: dict[str, Any], links: ImageLinks | None = None) -> list[dict[str, Any]]:
    """The conversation: messages for env episodes, else prompt + response text.

    Assistant turns get their parsed tool calls and the env's reward for that
    turn (turn k of `turn_rewards` belongs to the k-th assistant message).
    Turns that show images get `parts` (see the module docstring).
    """
    links = links or ImageLinks()
    messages = record.get("messages") or []
    if not messages:
        prompt: dict[str, Any] = {"role": "prompt", "content": record.get("prompt_text", "")}
        if parts := prompt_parts(record, prompt["content"], links):
            prompt["parts"] = parts
        return [
            prompt,
            {
                "role": "assistant",
                "content": record.get("response_text", ""),
                "reward": _finite(record.get("reward")),
                "tool_calls": [],
                "tool_call_errors": [],
            },
        ]
    rewards = record.get("turn_rewards") or []
    out, k = [], 0
    for m in messages:
        turn: dict[str, Any] = {"role": m.get("role", "?"), "content": _text(m.get("content"))}
        if parts := message_parts(m.get("content"), links):
            turn["parts"] = parts
        if m.get("name"):
            turn["name"] = m["name"]
        if turn["role"] == "assistant":
            calls, errors = parse_tool_calls(turn["content"])
            turn["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
            turn["tool_call_errors"] = [{"kind": e.kind, "message": e.message} for e in errors]
            turn["reward"] = _finite(rewards[k]) if k < len(rewards) else None
            k += 1
        out.append(turn)
    return out


def token_fields(
    record: dict[str, Any], step: int, links: ImageLinks | None = None
) -> dict[str, Any]:
    """Per-response-token arrays for the heat map, and which fields are missing and why.

    `images`: the response's image token runs, each drawn as one picture."""
    ids = list(record.get("response_ids") or [])
    n = len(ids)
    mask = _padded(record.get("loss_mask"), n, 0)
    behaviour = _padded(record.get("behaviour_logprobs"), n, None)
    versions = _padded(record.get("versions"), n, -1)
    per_token_adv = record.get("token_advantages")
    scalar_adv = _finite(record.get("advantage"))
    if isinstance(per_token_adv, list) and len(per_token_adv) == n:
        advantage = [_finite(a) if m else None for a, m in zip(per_token_adv, mask, strict=True)]
    else:
        advantage = [scalar_adv if m else None for m in mask]
    # The sync loop trains step s on version s-1 tokens: staleness = (s-1) - version.
    fields: dict[str, list[Any]] = {
        "behaviour_logprob": [
            _finite(b) if m else None for b, m in zip(behaviour, mask, strict=True)
        ],
        "advantage": advantage,
        "version": [v if m else None for v, m in zip(versions, mask, strict=True)],
        "staleness": [
            (step - 1 - v) if m and v >= 0 else None for v, m in zip(versions, mask, strict=True)
        ],
    }
    missing: dict[str, str] = {}
    trainer = record.get("trainer_logprobs")
    if isinstance(trainer, list) and len(trainer) == n:
        fields["trainer_logprob"] = [
            _finite(t) if m else None for t, m in zip(trainer, mask, strict=True)
        ]
        fields["mismatch"] = [
            t - b if t is not None and b is not None else None
            for t, b in zip(fields["trainer_logprob"], fields["behaviour_logprob"], strict=True)
        ]
    else:
        missing["mismatch"] = MISMATCH_MISSING
    spans = record.get("turn_spans") or []
    turn_of = [-1] * n
    for k, (start, end) in enumerate(spans):
        for i in range(max(start, 0), min(end, n)):
            turn_of[i] = k
    return {
        "tokens": {
            "ids": ids,
            "mask": mask,
            "turn": turn_of,
            "fields": fields,
            "images": response_chips(record, links or ImageLinks()),
        },
        "missing_fields": missing,
    }


class TokenDecoder:
    """Token id → text piece for one run, from the run's own tokenizer.json.

    Uses the `tokenizers` library directly (milliseconds) rather than
    transformers (seconds of import). Looks in the run's newest checkpoint
    first (exactly the run's tokenizer), then in `model.path` of config.toml,
    then asks `temper.models` to resolve aliases such as "tiny".
    """

    def __init__(self) -> None:
        self._cache: dict[Path, Any] = {}
        self._lock = threading.Lock()

    def pieces(self, run_dir: Path, ids: list[int]) -> tuple[list[str] | None, str | None]:
        """(text of each id, None) or (None, why the tokenizer could not be loaded)."""
        with self._lock:
            if run_dir not in self._cache:
                self._cache[run_dir] = self._load(run_dir)
            tok = self._cache[run_dir]
        if isinstance(tok, str):
            return None, tok
        return [tok.decode([i], skip_special_tokens=False) for i in ids], None

    def forget(self, run_dir: Path) -> None:
        with self._lock:
            self._cache.pop(run_dir, None)

    def _load(self, run_dir: Path) -> Any:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return "the tokenizers package is not installed"
        path = _find_tokenizer_json(run_dir)
        if path is None:
            return f"no tokenizer.json found for run {run_dir.name} (checkpoints or model.path)"
        try:
            return Tokenizer.from_file(str(path))
        except Exception as exc:  # a broken file must not take the page down
            return f"cannot load {path}: {exc}"


def _find_tokenizer_json(run_dir: Path) -> Path | None:
    ckpts = sorted(
        (run_dir / "checkpoints").glob("step_*/tokenizer.json"),
        key=lambda p: int(p.parent.name[5:]) if p.parent.name[5:].isdigit() else -1,
    )
    if ckpts:
        return ckpts[-1]  # the newest by step number (step_10 after step_9)
    try:
        config = tomllib.loads((run_dir / "config.toml").read_text())
        model_path = str(config["model"]["path"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return None
    candidate = Path(model_path).expanduser() / "tokenizer.json"
    if candidate.is_file():
        return candidate
    try:
        # Aliases ("tiny") live in temper.models; importing it pulls in torch, so only now.
        from temper.models.loader import resolve_model_path

        candidate = resolve_model_path(model_path) / "tokenizer.json"
    except Exception:
        return None
    return candidate if candidate.is_file() else None


def _padded(values: Any, n: int, fill: Any) -> list[Any]:
    values = list(values or [])
    return (values + [fill] * n)[:n]


def _finite(value: Any) -> float | None:
    """Numbers as floats; NaN/Inf and non-numbers as None (JSON has no NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(content: Any) -> str:
    """Message content as text; multimodal content lists keep their text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text", f"[{p.get('type', 'part')}]") for p in content if isinstance(p, dict)
        ]
        return "\n".join(parts)
    return "" if content is None else str(content)
