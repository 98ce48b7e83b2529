"""Where scored groups come from: single-turn prompts or multi-turn env episodes.

The orchestrator and the eval harness ask a rollout source for groups of
scored trajectories and do not care how they were made:

- `SingleTurnRollouts`: render each task's prompt, sample a group from the
  engine, score the completions with the run's `Reward`.
- `EpisodeRollouts`: play one episode per group member in a fresh env
  (`temper.rollout.multi_turn`); the reward is the sum of the env's per-turn
  rewards, plus the run's `Reward` on the final assistant message when
  ``add_reward`` is set. ``correct`` is the env's ``info["success"]`` when it
  reports one, else ``reward >= 1``.

Both return ``(groups, stats)`` where stats hold the seconds spent generating
and scoring and the number of reward failures.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Protocol

from temper.config.env import EpisodeLimits
from temper.engine.base import Engine, SamplingParams
from temper.envs.registry import EnvSpec
from temper.monitor.profile import stage
from temper.records import Task, Trajectory
from temper.rewards.base import Reward, RewardInput
from temper.rollout.multi_turn import run_episodes
from temper.rollout.scoring import score_trajectories
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.vision.prompting import PromptImages

Groups = list[list[Trajectory]]


class RolloutSource(Protocol):
    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[Groups, dict[str, float]]:
        """One group of ``params.n`` scored trajectories per task."""
        ...


class SingleTurnRollouts:
    """One prompt, one completion per sample, scored by ``reward``."""

    def __init__(self, engine: Engine, renderer: PromptRenderer, reward: Reward) -> None:
        self.engine, self.renderer, self.reward = engine, renderer, reward

    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[Groups, dict[str, float]]:
        t0 = time.perf_counter()
        with stage("generate"):
            groups = await rollout_groups(self.engine, self.renderer, tasks, params, seed=seed)
        t1 = time.perf_counter()
        by_id = {t.id: t for t in tasks}
        with stage("reward"):
            failures = await score_trajectories(self.reward, by_id, [t for g in groups for t in g])
        stats = {
            "time_generate_s": t1 - t0,
            "time_reward_s": time.perf_counter() - t1,
            "reward_errors": float(failures),
        }
        return groups, stats


class EpisodeRollouts:
    """Multi-turn episodes in the env of ``spec``, scored by the env (and ``reward``)."""

    def __init__(
        self,
        engine: Engine,
        spec: EnvSpec,
        tokenizer: Any,
        limits: EpisodeLimits,
        reward: Reward | None = None,
        max_concurrency: int | None = None,
        images: PromptImages | None = None,
        infra_retries: int = 2,
    ) -> None:
        self.engine, self.spec, self.tokenizer = engine, spec, tokenizer
        self.limits, self.reward, self.max_concurrency = limits, reward, max_concurrency
        #: A VLM's image handling (observations may show images); None: text only.
        self.images = images
        self.infra_retries = infra_retries

    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[Groups, dict[str, float]]:
        t0 = time.perf_counter()
        with stage("generate"):  # env steps run inside the episodes, so they count here
            groups = await run_episodes(
                self.engine,
                self.spec.make_env,
                tasks,
                self.tokenizer,
                replace(params, n=1),
                self.limits,
                seed,
                group_size=params.n,
                max_concurrency=self.max_concurrency,
                images=self.images,
                infra_retries=self.infra_retries,
            )
        t1 = time.perf_counter()
        flat = [t for g in groups for t in g]
        with stage("reward"):
            failures = await self._score(tasks, flat) if self.reward is not None else 0
        for t in flat:
            success = t.env_info.get("success")
            if success is not None:
                t.correct = bool(success)
            elif t.correct is None:
                t.correct = not math.isnan(t.reward) and t.reward >= 1.0
        stats = {
            "time_generate_s": t1 - t0,
            "time_reward_s": time.perf_counter() - t1,
            "reward_errors": float(failures),
        }
        return groups, stats

    async def _score(self, tasks: list[Task], trajs: list[Trajectory]) -> int:
        """Add the run's reward, on the last assistant message, to the env reward."""
        assert self.reward is not None
        by_id = {t.id: t for t in tasks}
        inputs = []
        for t in trajs:
            replies = [m.get("content") or "" for m in t.messages if m.get("role") == "assistant"]
            inputs.append(
                RewardInput(by_id[t.task_id], t.prompt_text, replies[-1] if replies else "")
            )
        results = await self.reward.score(inputs)
        failures = 0
        for t, r in zip(trajs, results, strict=True):
            t.reward += float(r.score)
            t.reward_components = {"env": float(sum(t.turn_rewards)), **r.components}
            t.reward_error = r.error
            if r.correct is not None:
                t.correct = r.correct
            failures += r.error is not None
        return failures
