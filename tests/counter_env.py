"""`counter_spec`: a small env for the env-service tests, served by `temper env-serve
tests/counter_env.py:counter_spec` or in a thread (`env_servers.ServerThread`).

Each step answers with what the policy said and the turn number, gives 0.5 per turn,
and ends after ``turns`` turns. Options: ``turns``; ``image`` (the first observation
shows a PNG); ``huge_bytes`` (each step's observation is that many bytes);
``die_once_file`` (the first server process to step creates the file and dies). A server
process started with ``TEMPER_TEST_CRASH_ON_STEP=1`` dies at its first step, as a lost
server does; ``TEMPER_TEST_SLOW_STEP_S`` makes every step that slow.
"""

from __future__ import annotations

import asyncio
import io
import os
from typing import Any

from temper.envs import AssistantTurn, StepResult
from temper.envs.registry import EnvSpec
from temper.records import Task

TASKS = [Task(id=f"count-{i}", prompt=f"count to {i}", answer=str(i)) for i in range(4)]


def png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


class CounterEnv:
    def __init__(self, options: dict[str, Any]) -> None:
        self.options, self.turn, self.closed = options, 0, False
        self.tools: list[dict[str, Any]] = [
            {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}
        ]

    async def reset(self, task: Task, seed: int | None = None) -> list[dict[str, Any]]:
        text = f"{task.prompt} (seed {seed})"
        if self.options.get("image"):
            content = [
                {"type": "text", "text": text},
                {"type": "image", "image": png((9, 99, 199))},
            ]
            return [{"role": "user", "content": content}]
        return [{"role": "user", "content": text}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        if os.environ.get("TEMPER_TEST_CRASH_ON_STEP") or self._first_to_die():
            os._exit(17)
        await asyncio.sleep(float(os.environ.get("TEMPER_TEST_SLOW_STEP_S", "0")))
        self.turn += 1
        body = "x" * int(self.options.get("huge_bytes", 0)) or f"you said {turn.text!r}"
        done = self.turn >= int(self.options.get("turns", 2))
        return StepResult(
            [{"role": "user", "content": f"{body} (turn {self.turn})"}],
            reward=0.5,
            done=done,
            info={"success": done},
            metrics={"counted": 1.0},
        )

    def _first_to_die(self) -> bool:
        """With ``die_once_file``: True in the one process that creates that file."""
        path = self.options.get("die_once_file")
        if not path:
            return False
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    async def close(self) -> None:
        self.closed = True


def counter_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    return EnvSpec(make_env=lambda task: CounterEnv(options), train=None, heldout=list(TASKS))
