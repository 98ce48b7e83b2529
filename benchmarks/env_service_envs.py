"""The envs of benchmarks/env_service.py, written for Temper (spec factories for
``temper env-serve --env.type=benchmarks/env_service_envs.py:<name>``).

- ``echo_spec``: OpenEnv's ``openenv init`` echo env, the same behaviour: reset says
  "Echo Env environment ready!", a step echoes the message with reward len * 0.1.
- ``sleep_spec``: a step is a 1 s tool call (``asyncio.sleep``): sleep-bound.
- ``cpu_spec``: a step runs a Python snippet in a warm bubblewrap sandbox: CPU-bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temper.envs.base import AssistantTurn, StepResult
from temper.envs.registry import EnvSpec
from temper.records import Task

#: The CPU-bound step's snippet (~20 ms of CPU), the same for both servers.
SNIPPET = "print(sum(i * i for i in range(300_000)))"
READY = "Echo Env environment ready!"


class EchoEnv:
    def __init__(self, sleep_s: float = 0.0, sandbox: Any = None) -> None:
        self.sleep_s, self.sandbox = sleep_s, sandbox
        self.tools: list[dict[str, Any]] = []

    async def reset(self, task: Task, seed: int | None = None) -> list[dict[str, Any]]:
        return [{"role": "user", "content": READY}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        text = turn.text
        if self.sandbox is not None:
            text = (await self.sandbox.arun_python(SNIPPET)).stdout.strip()
        return StepResult([{"role": "user", "content": text}], reward=len(turn.text) * 0.1)

    async def close(self) -> None:
        return None


def echo_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    return EnvSpec(make_env=lambda task: EchoEnv(), heldout=[Task("t", "echo")])


def sleep_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    return EnvSpec(make_env=lambda task: EchoEnv(sleep_s=1.0), heldout=[Task("t", "sleep")])


def cpu_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    from temper.sandbox import SandboxPool

    pool = SandboxPool(pool_size=int(options.get("pool_size", 4)), allow_fallback=False)
    return EnvSpec(
        make_env=lambda task: EchoEnv(sandbox=pool), heldout=[Task("t", "cpu")], close=pool.close
    )
