"""Agents as a rollout source: each episode is the user's agent, talking to the run's
engine through its own gateway session (`temper.serve.gateway`).

`AgentRollouts.groups` plays ``params.n`` episodes per task, at most
``max_concurrency`` at once, each within ``limits.timeout_s`` of the agent's own
time (its calls' time in the engine is not counted; see `_within`). An episode's
trajectory is its session's last row; rows before it (after a break) ride along
in `Trajectory.extra_rows` and are trained with the episode's advantage.

The reward, first found wins: the agent's return value, a ``POST`` to the
session's reward URL, the run's `Reward` on the final assistant message.
``correct`` is the reward's verdict when it gives one, else ``reward >= 1``.

Failures belong to their episode, never to the run: an agent that raised, hung
(timeout), returned a non-number, or made no call ends ``agent_error`` or
``timeout`` with the reason in `env_error`; its reward is NaN (left out of
training) or 0 (``on_error = "zero"``). A call the gateway refused for the
episode's limits ends the episode ``max_turns`` / ``token_budget``, scored as
usual: running out of turns is the policy's doing.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from temper.agents.programs import AgentOutcome, AgentProgram
from temper.config.env import EpisodeLimits
from temper.engine.base import Engine, SamplingParams
from temper.monitor.profile import stage
from temper.records import Task, Trajectory
from temper.rewards.base import Reward, RewardInput
from temper.serve.agent_session import Row
from temper.serve.gateway import AgentGateway, GatewaySession

_TASK_SEED_STRIDE = 100003


class AgentRollouts:
    """Episodes played by ``agent`` through a gateway on this event loop."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        agent: AgentProgram,
        limits: EpisodeLimits,
        reward: Reward | None = None,
        *,
        max_concurrency: int | None = None,
        splice: bool = True,
        on_error: str = "drop",
        model_name: str = "temper",
    ) -> None:
        self.engine, self.tokenizer, self.agent = engine, tokenizer, agent
        self.limits, self.reward = limits, reward
        self.max_concurrency, self.splice, self.on_error = max_concurrency, splice, on_error
        self.gateway = AgentGateway(engine, tokenizer, model_name)
        self._started = False

    async def _gateway(self) -> AgentGateway:
        if not self._started:
            await self.gateway.start()
            self._started = True
        return self.gateway

    async def close(self) -> None:
        if self._started:
            await self.gateway.stop()
            self._started = False

    def close_now(self) -> None:
        """Stop the gateway from outside its loop (`Rollouts.close`): it stops listening
        and its task ends on its own loop."""
        self.gateway.request_stop()

    async def groups(
        self, tasks: list[Task], params: SamplingParams, seed: int | None = None
    ) -> tuple[list[list[Trajectory]], dict[str, float]]:
        gateway = await self._gateway()
        n = params.n
        gate = asyncio.Semaphore(self.max_concurrency or len(tasks) * n or 1)
        run_params = SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_new_tokens=params.max_new_tokens,
            stop_token_ids=params.stop_token_ids,
        )

        async def one(i: int, j: int) -> tuple[Trajectory, AgentOutcome]:
            episode_seed = None if seed is None else seed * _TASK_SEED_STRIDE + i * n + j
            async with gate:
                return await self._episode(gateway, tasks[i], i, episode_seed, run_params)

        t0 = time.perf_counter()
        with stage("generate"):
            flat = await asyncio.gather(*[one(i, j) for i in range(len(tasks)) for j in range(n)])
        t1 = time.perf_counter()
        with stage("reward"):
            failures = await self._score(tasks, flat)
        trajs = [t for t, _ in flat]
        groups = [trajs[i * n : (i + 1) * n] for i in range(len(tasks))]
        stats = {
            "time_generate_s": t1 - t0,
            "time_reward_s": time.perf_counter() - t1,
            "reward_errors": float(failures),
        }
        return groups, stats

    async def _episode(
        self,
        gateway: AgentGateway,
        task: Task,
        group_id: int,
        seed: int | None,
        params: SamplingParams,
    ) -> tuple[Trajectory, AgentOutcome]:
        session = gateway.open(params, self.limits, seed, self.splice)
        reward_url = session.base_url.removesuffix("/v1") + "/reward"
        finish = "done"
        try:
            outcome = await _within(
                self.agent.run(session.base_url, reward_url, task), session, self.limits.timeout_s
            )
        except TimeoutError:
            outcome = AgentOutcome(error=f"agent did not finish within {self.limits.timeout_s}s")
            finish = "timeout"
        finally:
            gateway.close(session.record.id)
        if outcome.error is not None and session.cut is not None:
            finish, outcome = session.cut, AgentOutcome()  # the policy ran out of room
        elif outcome.error is not None and finish != "timeout":
            finish = "agent_error"
        elif not session.record.rows:
            finish = "agent_error"
            outcome = AgentOutcome(error="the agent made no model call")
        traj = _trajectory(session, task, group_id, seed, self.tokenizer, finish)
        traj.env_error = outcome.error
        if outcome.reward is None and outcome.error is None and session.posted_reward is not None:
            outcome.reward = session.posted_reward
        return traj, outcome

    async def _score(self, tasks: list[Task], flat: list[tuple[Trajectory, AgentOutcome]]) -> int:
        """Set each episode's reward (see the module doc); returns the reward failures."""
        by_id = {t.id: t for t in tasks}
        need = [(t, o) for t, o in flat if o.error is None and o.reward is None]
        failures = 0
        if need and self.reward is not None:
            inputs = [
                RewardInput(by_id[t.task_id], t.prompt_text, _last_answer(t)) for t, _ in need
            ]
            for (t, o), r in zip(need, await self.reward.score(inputs), strict=True):
                o.reward = float(r.score)
                t.reward_components = dict(r.components)
                t.reward_error = r.error
                t.correct = r.correct
                failures += r.error is not None
        for t, o in flat:
            if o.error is not None:
                t.reward = 0.0 if self.on_error == "zero" else math.nan
            elif o.reward is None:
                t.reward, t.reward_error = (
                    math.nan,
                    "no reward: the agent gave none, posted none, and the run has no [reward]",
                )
                failures += 1
            else:
                t.reward = o.reward
            if t.correct is None:
                t.correct = not math.isnan(t.reward) and t.reward >= 1.0
            for extra in t.extra_rows:
                extra.reward = t.reward
        return failures


def _last_answer(traj: Trajectory) -> str:
    replies = [m.get("content") or "" for m in traj.messages if m.get("role") == "assistant"]
    return replies[-1] if replies else ""


def _row_trajectory(row: Row, task: Task, group_id: int, tokenizer: Any, finish: str) -> Trajectory:
    return Trajectory(
        task_id=task.id,
        group_id=group_id,
        prompt_ids=row.prompt_ids,
        response_ids=row.response_ids,
        loss_mask=row.loss_mask,
        behaviour_logprobs=row.logprobs,
        versions=row.versions,
        finish_reason=finish,
        prompt_text=tokenizer.decode(row.prompt_ids, skip_special_tokens=False),
        response_text=tokenizer.decode(row.response_ids, skip_special_tokens=False),
        category=task.category,
        answer=task.answer,
        num_turns=len(row.turn_spans),
        turn_spans=row.turn_spans,
        turn_rewards=[0.0] * len(row.turn_spans),
        messages=row.raw_messages,
    )


def _trajectory(
    session: GatewaySession,
    task: Task,
    group_id: int,
    seed: int | None,
    tokenizer: Any,
    finish: str,
) -> Trajectory:
    """The episode's last row, with the rows before it as `extra_rows`."""
    rows = session.record.rows
    if not rows:
        traj = Trajectory(task.id, group_id, [], [], [], [], [], finish, category=task.category)
    else:
        traj = _row_trajectory(rows[-1], task, group_id, tokenizer, finish)
        traj.extra_rows = [_row_trajectory(r, task, group_id, tokenizer, "done") for r in rows[:-1]]
    traj.env_metrics = session.record.metrics()
    traj.episode_seed = seed
    traj.answer = task.answer
    return traj


async def _within(run: Any, session: GatewaySession, timeout_s: float | None) -> AgentOutcome:
    """Await the agent; cancel it (TimeoutError) once it has spent ``timeout_s`` of its
    own time (`GatewaySession.agent_s`). Time in the engine does not count: when a
    step's or an eval's episodes all start at once, the later ones queue behind the
    others' generation, which is the policy's time, not a hung agent's."""
    task = asyncio.ensure_future(run)
    if timeout_s is None:
        return await task
    try:
        while True:
            left = timeout_s - session.agent_s()
            if left <= 0 and session.engine_since is None:
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=max(left, 0.05))
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
