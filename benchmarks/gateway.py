"""Rollout gateway overhead: the same agent through the gateway and straight at the engine.

One event loop, one native engine (the built-in tiny model). The agent is a plain
`openai`-client loop of three chat calls per episode, each extending the last.
- **direct**: the agent's base URL is `temper serve`'s app (the same `OpenAIServer`)
  on the same loop;
- **gateway**: its base URL is an `AgentGateway` session per episode, which also
  renders, checks the extension property, records token-exact rows and opens and
  closes the session.

Both run ``--episodes`` episodes, ``--concurrency`` at once, alternated ``--rounds``
times. Then the gateway holds ``--sessions`` concurrent agent sessions (default 256)
and the run checks every one finished with a token-exact single row.

Prints one JSON line: tokens/s and episodes/s of each, ``tokens_per_s_over_direct``,
``episodes_per_s_over_direct``, and the concurrent-sessions result.

    python benchmarks/gateway.py [--episodes 64 --concurrency 16 --sessions 256]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

from openai import AsyncOpenAI

from temper.config.env import EpisodeLimits
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.serve.gateway import AgentGateway
from temper.serve.openai_server import create_app

QUESTIONS = [f"What is {a} + {a * 7 % 13}?" for a in range(40)]
MAX_TOKENS = 24


async def agent(client: AsyncOpenAI, question: str, seed: int) -> int:
    """Three calls, each extending the conversation; returns the completion tokens."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    tokens = 0
    for turn in range(3):
        r = await client.chat.completions.create(
            model="temper",
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed * 10 + turn,
        )
        tokens += r.usage.completion_tokens if r.usage else 0
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "And then?"})
    return tokens


async def _serve(app: Any) -> tuple[str, Any, asyncio.Task[None]]:
    import uvicorn

    class Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Quiet(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, task


async def _direct(url: str, episodes: int, concurrency: int) -> tuple[float, int]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> int:
        async with gate:  # a client per episode, as the gateway's agents get
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
            try:
                return await agent(client, QUESTIONS[i % len(QUESTIONS)], i)
            finally:
                await client.close()

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*[one(i) for i in range(episodes)]))
    return time.perf_counter() - t0, tokens


async def _gateway(gw: AgentGateway, episodes: int, concurrency: int) -> tuple[float, int, int]:
    gate = asyncio.Semaphore(concurrency)
    run = SamplingParams(temperature=1.0, max_new_tokens=MAX_TOKENS)
    single_rows = 0

    async def one(i: int) -> int:
        nonlocal single_rows
        async with gate:
            session = gw.open(run, EpisodeLimits(max_turns=3), seed=i)
            client = AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
            try:
                return await agent(client, QUESTIONS[i % len(QUESTIONS)], i)
            finally:
                await client.close()
                done = gw.close(session.record.id)
                single_rows += len(done.record.rows) == 1 and done.record.calls == 3

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*[one(i) for i in range(episodes)]))
    return time.perf_counter() - t0, tokens, single_rows


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = load_tokenizer("tiny")
    engine = NativeEngine(load_model("tiny"), tokenizer)
    direct_url, direct_server, direct_task = await _serve(create_app(engine, tokenizer, "temper"))
    gw = AgentGateway(engine, tokenizer, "temper")
    await gw.start()
    await _direct(direct_url, 4, 4)  # warm both paths
    await _gateway(gw, 4, 4)
    d_time = d_tok = g_time = g_tok = 0.0
    for _ in range(args.rounds):  # alternated, so load drifts hit both alike
        t, tok = await _direct(direct_url, args.episodes, args.concurrency)
        d_time, d_tok = d_time + t, d_tok + tok
        t, tok, _ = await _gateway(gw, args.episodes, args.concurrency)
        g_time, g_tok = g_time + t, g_tok + tok
    held_s, _, single = await _gateway(gw, args.sessions, args.sessions)
    direct_server.should_exit = True
    await direct_task
    await gw.stop()
    n = args.episodes * args.rounds
    return {
        "benchmark": "gateway",
        "episodes": n,
        "concurrency": args.concurrency,
        "direct_tokens_per_s": round(d_tok / d_time, 1),
        "gateway_tokens_per_s": round(g_tok / g_time, 1),
        "direct_episodes_per_s": round(n / d_time, 2),
        "gateway_episodes_per_s": round(n / g_time, 2),
        "tokens_per_s_over_direct": round((g_tok / g_time) / (d_tok / d_time), 3),
        "episodes_per_s_over_direct": round(d_time / g_time, 3),
        "concurrent_sessions": args.sessions,
        "concurrent_sessions_token_exact": single,
        "concurrent_sessions_s": round(held_s, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=256)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
