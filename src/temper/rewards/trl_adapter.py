"""Use TRL-style reward functions as Temper rewards, and load them by name.

A TRL reward function is called as `fn(prompts=[...], completions=[...], **columns)`
and returns one float (or None: "does not apply") per completion, or one dict
``{"score": float, "correct": bool}`` to also say whether it is correct. See
`TRLRewardFunction`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from temper.errors import ConfigError, TemperError
from temper.rewards.base import (
    TRAINER_STATE,
    RewardDefaults,
    RewardInput,
    RewardResult,
    bad_score,
    format_traceback,
)
from temper.targets import load_target

#: Column names never passed through: TRL reserves them for its own arguments.
_RESERVED = frozenset(
    {"prompt", "completion", "completion_ids", "prompts", "completions", "trainer_state"}
)
#: What every call gets besides the dataset columns (`answer`, `solution` and
#: `category` only when no column has that name).
SUPPLIED = ("prompts", "completions", "completion_ids", "trainer_state", "answer", "solution",
            "category")  # fmt: skip


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _accepted_names(fn: Callable[..., Any]) -> tuple[set[str] | None, set[str]]:
    """(names fn accepts by keyword, or None if it takes **kwargs; names it requires)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None, set()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = {p.name for p in params if p.kind in keyword and p.default is p.empty}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None, required
    return {p.name for p in params if p.kind in keyword}, required


class _BatchFailed(Exception):
    """`fn` raised on a whole batch: one completion may be to blame, so each is retried."""


class _ContractBroken(Exception):
    """`fn` did not return one value per completion: a bug in `fn`, not in a completion.

    Not retried one completion at a time: a function that returns ``[1.0]`` for any
    batch would then pay every sample in full.
    """


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class TRLRewardFunction(RewardDefaults):
    """Wraps `fn(prompts, completions, **dataset_columns) -> list[float | None]` unchanged.

    For each batch, `fn` gets keyword arguments as TRL's GRPOTrainer passes them:
      - `prompts`: each task's prompt as in the dataset (a string, or a list of chat
        messages);
      - `completions`: the completion text, or `[{"role": "assistant", "content": text}]`
        when the prompt is a list of messages (TRL's conversational format);
      - `completion_ids`: the sampled token ids of each completion (None in env
        episodes, whose completion spans several turns);
      - `trainer_state`: an object with `global_step` (training steps completed
        when the batch was scored) and `max_steps` (`temper.rewards.base.TrainerState`);
      - one list per dataset column in `task.columns` (None where a task lacks it),
        the category column included;
      - `answer`, `solution` (each task's reference answer) and `category`, unless a
        column has that name.
    Arguments `fn` does not accept are left out when it has no `**kwargs`.
    `check_signature` refuses, before a run starts, a function that needs an
    argument none of these supply.

    `fn` may be sync or async. A sync `fn` runs in the event loop's thread (as in
    TRL) unless `run_in_thread=True`. Each returned value is one completion's score:
      - a finite number is the score;
      - None means "does not apply to this completion", as in TRL: the result has
        `not_applicable` set, and a weighted sum leaves this function out of it;
      - a dict ``{"score": x, "correct": c}`` is the score ``x`` (a number or None,
        as above) with the function's verdict ``c`` (True/False, 0/1, or None: no
        verdict): what the run's accuracy counts (`RewardResult.correct`). A plain
        number declares no verdict;
      - NaN, inf, a non-number or a dict with other keys is an error on that
        completion only (`error` set, score `failure_score`).
    When `fn` raises on a batch, the batch is scored again one completion at a
    time, so one bad completion never costs the others their scores; a completion
    on which `fn` still fails gets the error. When `fn` returns something other
    than one value per completion, every completion of the batch gets that error
    ("returned 1 value for 128 completions"): it is not rescored.
    `check_signature` refuses, before a run, a function that cannot take `completions`.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        *,
        failure_score: float = 0.0,
        run_in_thread: bool = False,
    ) -> None:
        if not callable(fn):
            raise TemperError(f"reward function must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.failure_score = failure_score
        self.run_in_thread = run_in_thread
        self._accepts, self._requires = _accepted_names(fn)

    def check_signature(self, columns: Iterable[str]) -> None:
        """Raise ConfigError if `fn` cannot be called with what a run supplies.

        ``columns``: the dataset's column names. Checked at the start of a run, so
        a wrong signature fails before any generation or eval.
        """
        self._check_takes_completions()
        available = set(SUPPLIED) | {c for c in columns if c not in _RESERVED}
        missing = self._requires - available
        if missing:
            raise ConfigError(
                f"reward function {self.name!r} needs argument(s) {sorted(missing)} that are not "
                f"dataset columns (it can get: {sorted(available)})"
            )
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return  # a builtin without a signature: nothing to check
        passed = available if self._accepts is None else available & self._accepts
        try:
            signature.bind(**dict.fromkeys(passed))
        except TypeError as exc:
            raise ConfigError(
                f"reward function {self.name!r} cannot be called as fn(prompts=..., "
                f"completions=..., **columns): {exc}"
            ) from exc

    def _check_takes_completions(self) -> None:
        """Refuse a function without a `completions` parameter (nor **kwargs).

        Such a function can be called (it gets only the columns it names) but never
        sees what it should score: its rewards say nothing about the completions.
        `prompts` is not required: arguments a function does not name are left out.
        """
        if self._accepts is None or "completions" in self._accepts:
            return  # **kwargs, or no signature to read (a builtin)
        raise ConfigError(
            f"reward function {self.name!r}{inspect.signature(self.fn)} cannot accept "
            "`completions`; "
            "a reward function is called as fn(prompts=..., completions=..., **columns) "
            "and must take `completions` by name or **kwargs"
        )

    def arguments(self, inputs: list[RewardInput]) -> dict[str, Any]:
        """The keyword arguments `fn` is called with for this batch."""
        prompts: list[Any] = []
        completions: list[Any] = []
        for item in inputs:
            prompt = item.task.prompt
            prompts.append(prompt)
            if isinstance(prompt, list):
                completions.append([{"role": "assistant", "content": item.completion_text}])
            else:
                completions.append(item.completion_text)
        kwargs: dict[str, Any] = {
            "prompts": prompts,
            "completions": completions,
            "completion_ids": [item.completion_ids for item in inputs],
            "trainer_state": TRAINER_STATE,
        }
        keys = dict.fromkeys(k for item in inputs for k in item.task.columns if k not in _RESERVED)
        for key in keys:
            kwargs[key] = [item.task.columns.get(key) for item in inputs]
        for key in ("answer", "solution"):
            kwargs.setdefault(key, [item.task.answer for item in inputs])
        kwargs.setdefault("category", [item.task.category for item in inputs])
        missing = self._requires - kwargs.keys()
        if missing:
            raise TemperError(
                f"reward function {self.name!r} needs argument(s) {sorted(missing)} that are not "
                f"dataset columns (it can get: {sorted(kwargs)})"
            )
        if self._accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self._accepts}
        return kwargs

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        """Call `fn` on the whole batch; if that fails, on each completion alone."""
        if not inputs:
            return []
        try:
            values = await self._call(inputs)
        except _ContractBroken as broken:
            return [self._failure(str(broken)) for _ in inputs]
        except _BatchFailed as failure:
            if len(inputs) == 1:
                return [self._failure(str(failure), failure.__cause__)]
            return [(await self.score([item]))[0] for item in inputs]
        return [self._result(v) for v in values]

    async def _call(self, inputs: list[RewardInput]) -> list[Any]:
        kwargs = self.arguments(inputs)
        try:
            if self.run_in_thread and not inspect.iscoroutinefunction(self.fn):
                out = await asyncio.to_thread(self.fn, **kwargs)
            else:
                out = self.fn(**kwargs)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:
            raise _BatchFailed(f"reward function {self.name!r} raised {_one_line(exc)}") from exc
        if hasattr(out, "tolist"):  # numpy arrays, torch tensors
            out = out.tolist()
        if not isinstance(out, list | tuple):
            raise _ContractBroken(
                f"reward function {self.name!r} must return a list (of floats, or of "
                f'{{"score": ..., "correct": ...}} dicts), got {type(out).__name__}'
            )
        if len(out) != len(inputs):
            raise _ContractBroken(
                f"reward function {self.name!r} returned {_plural(len(out), 'value')} for "
                f"{_plural(len(inputs), 'completion')}"
            )
        return list(out)

    def _result(self, value: Any) -> RewardResult:
        correct: bool | None = None
        if isinstance(value, dict):
            problem = _dict_problem(value)
            if problem is not None:
                return self._failure(f"reward function {self.name!r} returned {problem}")
            value, verdict = value["score"], value.get("correct")
            correct = None if verdict is None else bool(float(verdict))
        if value is None:
            return RewardResult(score=0.0, not_applicable=True)
        bad = bad_score(value)
        if bad is not None:
            return self._failure(
                f"reward function {self.name!r} returned {bad}; expected a finite number or None"
            )
        score = float(value)
        return RewardResult(score=score, components={self.name: score}, correct=correct)

    def _failure(self, error: str, exc: BaseException | None = None) -> RewardResult:
        return RewardResult(
            score=self.failure_score,
            components={self.name: self.failure_score},
            error=error,
            traceback=None if exc is None else format_traceback(exc),
        )


def _dict_problem(value: dict[Any, Any]) -> str | None:
    """What is wrong with a returned ``{"score": ..., "correct": ...}`` dict; None if nothing."""
    extra = sorted(str(k) for k in value if k not in ("score", "correct"))
    if "score" not in value or extra:
        what = f"keys {extra}" if extra else "no 'score'"
        return f'a dict with {what}; expected {{"score": number or None, "correct": bool}}'
    verdict = value.get("correct")
    if verdict is not None and (bad_score(verdict) is not None or float(verdict) not in (0, 1)):
        return f"'correct' = {verdict!r}; expected True, False or None"
    return None


def load_reward_function(spec: str, what: str = "reward function") -> Callable[..., Any]:
    """The function ``spec`` names (`temper.targets.load_target`); ``what`` names its role."""
    return load_target(spec, what)
