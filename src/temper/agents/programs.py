"""The two kinds of user agent, and how one episode of each is run.

- `FunctionAgent`: ``await fn(client, task)`` with ``client`` an
  ``openai.AsyncOpenAI`` on the episode's session URL (no retries: a refused
  call is the agent's to handle) and ``task`` a `temper.records.Task`.
- `CommandAgent`: the program ``argv`` run once per episode in its own process
  group, with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``TEMPER_TASK`` (the task
  as JSON) and ``TEMPER_REWARD_URL`` set. Its reward is its last stdout line
  (a number, or ``{"reward": x}``), or nothing (then a POST, or the run's reward).

Both return `AgentOutcome`: the reward the agent gave (None: none), or the
one-line reason it failed. Timeouts are the caller's (`asyncio.timeout`); a
command is killed with its process group when cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from temper.records import Task


@dataclass
class AgentOutcome:
    reward: float | None = None
    error: str | None = None


class AgentProgram(Protocol):
    async def run(self, base_url: str, reward_url: str, task: Task) -> AgentOutcome:
        """Play one episode against ``base_url``; what the agent gave back."""
        ...


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def check_reward(value: Any, who: str) -> AgentOutcome:
    """A returned reward: a finite number, or None; anything else is an error."""
    if value is None:
        return AgentOutcome()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return AgentOutcome(
            error=f"{who} returned {one_line(repr(value), 80)}, not a number or None"
        )
    if not math.isfinite(value):
        return AgentOutcome(error=f"{who} returned {value}, not a finite number")
    return AgentOutcome(reward=float(value))


class FunctionAgent:
    def __init__(self, fn: Any, name: str, api_key: str) -> None:
        self.fn, self.name, self.api_key = fn, name, api_key

    async def run(self, base_url: str, reward_url: str, task: Task) -> AgentOutcome:
        from openai import AsyncOpenAI  # the agent's own client library

        client = AsyncOpenAI(base_url=base_url, api_key=self.api_key, max_retries=0)
        try:
            value = await self.fn(client, task)
        except Exception as exc:  # the agent's failure is its episode's, not the run's
            return AgentOutcome(error=f"agent raised {type(exc).__name__}: {one_line(exc)}")
        finally:
            await client.close()
        return check_reward(value, "agent")


class CommandAgent:
    def __init__(self, argv: list[str], api_key: str) -> None:
        self.argv, self.api_key = list(argv), api_key

    async def run(self, base_url: str, reward_url: str, task: Task) -> AgentOutcome:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": self.api_key,
            "TEMPER_TASK": json.dumps(asdict(task), default=str),
            "TEMPER_REWARD_URL": reward_url,
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return AgentOutcome(error=f"agent command {self.argv[0]!r} cannot start: {exc}")
        try:
            out, err = await proc.communicate()
        except BaseException:  # cancelled (the episode's timeout): no orphan agent
            _kill_group(proc.pid)
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no stderr)"]
            return AgentOutcome(error=f"agent exited {proc.returncode}: {one_line(tail[0])}")
        return _stdout_reward(out.decode(errors="replace"))


def _stdout_reward(out: str) -> AgentOutcome:
    lines = out.strip().splitlines()
    if not lines:
        return AgentOutcome()
    last = lines[-1].strip()
    try:
        value = json.loads(last)
    except ValueError:
        return AgentOutcome()  # a log line: no reward given this way
    if isinstance(value, dict):
        if "reward" not in value:
            return AgentOutcome()
        value = value["reward"]
    return check_reward(value, "agent command")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
