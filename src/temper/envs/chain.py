"""A chain of arithmetic questions, one per turn: a multi-step env with a process reward.

An episode asks `length` questions from `temper.data.arithmetic` in turn
(`What is 47 + 38?`, the form the built-in tiny model knows). Each turn the
model answers (the last `\\boxed{N}`, else the last integer of its text) and
the env replies with the next question; after the last one the episode ends.
The env tells the model nothing about its answers, so the turns are
independent problems that share one episode.

Rewards per turn (`StepResult.reward`, the env's intermediate reward, which
lands in `Trajectory.turn_rewards`): `step_reward` for a right answer, 0.0
for a wrong or missing one; the last turn also earns `success_reward` when
every answer was right (the outcome). The episode's reward is their sum.
`info["success"]` (all right) is the episode's `correct`; `info["right"]`
counts the right answers.

This is the env the turn-level credit benchmark (`benchmarks/credit.py`)
trains on: outcome credit gives every turn the episode's total, so each
answer's advantage carries the other answers' luck; turn-level credit
(`algo.credit = "turn"`) gives each its own return. Tasks are procedural,
with the arithmetic split (a chain is held out when all its problems are).
"""

from __future__ import annotations

import random
from typing import Any

from temper.data.arithmetic import DEFAULT_LEVELS, LEVELS, Problem, is_heldout, make_problem
from temper.data.sampler import ProceduralSampler
from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.games import GuessNumberEnv, _options
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError
from temper.records import Task


class ChainTasks:
    """Tasks of `length` problems at `levels`, all from one arithmetic split."""

    def __init__(self, length: int = 3, levels: tuple[int, ...] = DEFAULT_LEVELS) -> None:
        self.length, self.levels = length, levels

    def _problem(self, rng: random.Random, heldout: bool) -> Problem:
        while True:
            p = make_problem(rng, rng.choice(self.levels))
            if is_heldout(p) == heldout:
                return p

    def task(self, problems: list[Problem]) -> Task:
        columns = {
            "questions": [p.prompt for p in problems],
            "answers": [p.answer for p in problems],
        }
        tid = "chain-" + "_".join(p.text for p in problems)
        answer = ",".join(str(p.answer) for p in problems)
        return Task(tid, problems[0].prompt, answer, "chain", columns)

    def sample(self, rng: random.Random, k: int = 1) -> list[Task]:
        """k training-split chains."""
        return [
            self.task([self._problem(rng, False) for _ in range(self.length)]) for _ in range(k)
        ]

    def heldout(self, n: int, seed: int = 1234) -> list[Task]:
        """The same n held-out chains every time."""
        rng = random.Random(seed)
        return [self.task([self._problem(rng, True) for _ in range(self.length)]) for _ in range(n)]


class ChainEnv:
    """Plays one chain per `reset`; see the module doc for the rewards."""

    def __init__(self, step_reward: float = 1.0, success_reward: float = 0.0) -> None:
        self.step_reward, self.success_reward = step_reward, success_reward
        self.questions: list[str] = []
        self.answers: list[int] = []
        self.turn = self.right = 0

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        """Start a chain (columns questions, answers); seed is unused."""
        self.questions = list(task.columns["questions"])
        self.answers = [int(a) for a in task.columns["answers"]]
        self.turn = self.right = 0
        return task.messages()

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.turn >= len(self.answers):
            raise RuntimeError("ChainEnv.step called before reset or after the end")
        ok = GuessNumberEnv.parse_guess(turn.text) == self.answers[self.turn]
        self.turn += 1
        self.right += ok
        done = self.turn == len(self.answers)
        success = done and self.right == len(self.answers)
        reward = self.step_reward * ok + (self.success_reward if success else 0.0)
        observation = [] if done else [{"role": "user", "content": self.questions[self.turn]}]
        info = {"success": success, "right": self.right}
        return StepResult(observation, reward, done, info, {"right": float(ok)})

    async def close(self) -> None:
        self.turn = len(self.answers)


_CHAIN_OPTIONS = {
    "length": 3, "levels": [1, 2, 3], "step_reward": 1.0, "success_reward": 0.0,
    "eval_size": 64,
}  # fmt: skip


def chain_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for `env.type = "arithmetic_chain"`.

    Options (defaults): length (3 questions), levels ([1, 2, 3]), step_reward
    (1.0), success_reward (0.0), eval_size (64 held-out chains).
    """
    o = _options(options, _CHAIN_OPTIONS, "arithmetic_chain")
    levels = o["levels"]
    if not isinstance(levels, list) or not levels or any(lv not in LEVELS for lv in levels):
        raise ConfigError(
            f"env.options.levels must be a non-empty list of levels in {LEVELS}, got {levels!r}"
        )
    gen = ChainTasks(o["length"], tuple(levels))
    return EnvSpec(
        make_env=lambda task: ChainEnv(o["step_reward"], o["success_reward"]),
        train=ProceduralSampler(gen, seed),
        heldout=gen.heldout(o["eval_size"]),
        name="arithmetic_chain",
    )
