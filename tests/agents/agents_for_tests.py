"""Agents the tests train and break: well-behaved ones, and each kind of bad one."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

ASK = [{"role": "user", "content": "What is 2 + 3?"}]


async def answers(client: Any, task: Any) -> float | None:
    """Two calls (the second extends the first); the run's reward scores the answer."""
    r = await client.chat.completions.create(model="temper", messages=task.messages())
    follow = [*task.messages(), r.choices[0].message.model_dump(exclude_none=True)]
    follow.append({"role": "user", "content": "Give the final answer in \\boxed{}."})
    await client.chat.completions.create(model="temper", messages=follow)
    return None


async def scores_itself(client: Any, task: Any) -> float:
    await client.chat.completions.create(model="temper", messages=ASK)
    return 0.25


async def posts_reward(client: Any, task: Any) -> None:
    await client.chat.completions.create(model="temper", messages=ASK)
    url = str(client.base_url).rstrip("/").removesuffix("/v1") + "/reward"
    async with httpx.AsyncClient() as http:
        (await http.post(url, json={"reward": 0.75})).raise_for_status()


async def raises(client: Any, task: Any) -> None:
    await client.chat.completions.create(model="temper", messages=ASK)
    raise KeyError("tool_result")


async def hangs(client: Any, task: Any) -> None:
    await client.chat.completions.create(model="temper", messages=ASK)
    await asyncio.sleep(3600)


async def returns_nan(client: Any, task: Any) -> float:
    await client.chat.completions.create(model="temper", messages=ASK)
    return float("nan")


async def returns_text(client: Any, task: Any) -> str:
    await client.chat.completions.create(model="temper", messages=ASK)
    return "great"


async def never_calls(client: Any, task: Any) -> float:
    return 1.0


async def loops_forever(client: Any, task: Any) -> None:
    while True:  # stopped by the gateway's max_turns
        await client.chat.completions.create(model="temper", messages=ASK)


async def sends_malformed(client: Any, task: Any) -> None:
    """One good call, then a message with no role (the openai client raises on the 400)."""
    await client.chat.completions.create(model="temper", messages=ASK)
    await client.chat.completions.create(model="temper", messages=[{"content": "hi"}])


async def calls_another_session(client: Any, task: Any) -> None:
    """One good call, then a call on a session id that does not exist (a 404)."""
    await client.chat.completions.create(model="temper", messages=ASK)
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    other = client.with_options(base_url=base.rsplit("/", 1)[0] + "/no-such-session/v1")
    await other.chat.completions.create(model="temper", messages=ASK)


def not_async(client: Any, task: Any) -> None:
    return None
