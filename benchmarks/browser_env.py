"""The MiniWoB++ browser env: scripted oracle vs random policy, and pooled throughput.

1. Success rates of the scripted oracle and of a random policy
   (`temper.envs.miniwob_scripted`) on the five easy tasks, ``--seeds``
   instances each, through the env's JSON actions exactly as a model acts.
2. Throughput: ``--episodes`` oracle episodes (the five tasks in turn) on a
   pool of ``--browsers`` browsers with that many episodes in flight, against
   one browser running them one at a time. No model: this measures the env
   (page reset, DOM read, actions over CDP).
3. Peak memory per browser while the pool runs, sampled every 0.1 s from
   /proc: RSS (every process of a browser's group, shared pages counted in
   each) and PSS (shared pages split; the honest per-browser footprint).
4. What isolation costs per reset (``--resets`` each, alternating, median):
   a fresh browser context and page, leased, loaded and released, as every
   episode now does, against reloading one page that is kept, as episodes
   did before they were isolated.

Prints one JSON line.

    .venv/bin/python benchmarks/browser_env.py [--seeds 20] [--episodes 60] [--browsers 4]
        [--resets 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time
from typing import Any

from temper.builder.tasks import build_env_spec
from temper.envs.miniwob import make_task, start_episode
from temper.envs.miniwob_scripted import ORACLE_TASKS, Oracle, RandomPolicy, play


async def _episode(spec: Any, task: Any, policy: Any, max_turns: int = 6) -> tuple[float, bool]:
    env = spec.make_env(task)
    try:
        return await play(env, task, policy, max_turns)
    finally:
        await env.close()


async def _success(spec: Any, seeds: int, policy_for: Any, max_turns: int) -> dict[str, float]:
    out = {}
    for name in ORACLE_TASKS:
        tasks = [make_task(name, 1000 + s) for s in range(seeds)]
        runs = [_episode(spec, t, policy_for(t), max_turns) for t in tasks]
        results = await asyncio.gather(*runs)
        out[name] = sum(ok for _, ok in results) / len(results)
    return out


async def _throughput(spec: Any, episodes: int, in_flight: int) -> float:
    """Episodes per second with `in_flight` episodes at once (after a warm-up round)."""
    tasks = [make_task(ORACLE_TASKS[i % len(ORACLE_TASKS)], 5000 + i) for i in range(episodes)]
    gate = asyncio.Semaphore(in_flight)

    async def one(task: Any) -> bool:
        async with gate:
            return (await _episode(spec, task, Oracle()))[1]

    await asyncio.gather(*[one(t) for t in tasks[:in_flight]])  # browsers up, pages open
    start = time.perf_counter()
    solved = await asyncio.gather(*[one(t) for t in tasks])
    elapsed = time.perf_counter() - start
    assert all(solved), "the oracle failed an episode"
    return episodes / elapsed


async def _reset_cost(resets: int) -> tuple[float, float]:
    """Median seconds per reset: a fresh context (leased, loaded, released) and a kept
    page reloaded. Both in one browser, alternating, so machine load hits both alike."""
    spec = build_env_spec("miniwob", {"pool_size": 1, "pages_per_browser": 2}, 0)
    env = spec.make_env(None)
    pool, url = env.pool, env.resources.url("click-button")
    fresh: list[float] = []
    kept: list[float] = []
    try:
        session = await pool.lease()  # the kept page
        for seed in range(resets):
            start = time.perf_counter()
            episode = await pool.lease()
            await pool.call(start_episode(episode.page, url, seed))
            await pool.release(episode)
            fresh.append(time.perf_counter() - start)
            start = time.perf_counter()
            await pool.call(start_episode(session.page, url, seed))
            kept.append(time.perf_counter() - start)
        await pool.release(session)
    finally:
        spec.close()
    return statistics.median(fresh), statistics.median(kept)


class MemorySampler:
    """Peak RSS and PSS of each browser of a pool, sampled in a thread."""

    def __init__(self, pool: Any, every_s: float = 0.1) -> None:
        self.pool, self.every_s = pool, every_s
        self.peak = {"Rss": 0, "Pss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for kind in self.peak:
                self.peak[kind] = max([self.peak[kind], *self.pool.memory_bytes(kind)])

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--browsers", type=int, default=4)
    parser.add_argument("--resets", type=int, default=20)
    args = parser.parse_args()

    options = {"pool_size": args.browsers}
    pool_spec = build_env_spec("miniwob", options, 0)
    try:
        oracle = asyncio.run(_success(pool_spec, args.seeds, lambda t: Oracle(), 6))
        rand = asyncio.run(
            _success(pool_spec, args.seeds, lambda t: RandomPolicy(random.Random(t.id)), 3)
        )
        pool = pool_spec.make_env(None).pool
        with MemorySampler(pool) as memory:
            pooled = asyncio.run(_throughput(pool_spec, args.episodes, args.browsers))
    finally:
        pool_spec.close()
    one_spec = build_env_spec("miniwob", {"pool_size": 1}, 0)
    try:
        single = asyncio.run(_throughput(one_spec, args.episodes, 1))
    finally:
        one_spec.close()
    fresh_s, kept_s = asyncio.run(_reset_cost(args.resets))
    mean = {
        k: round(sum(v.values()) / len(v), 3) for k, v in (("oracle", oracle), ("random", rand))
    }
    print(
        json.dumps(
            {
                "benchmark": "browser_env",
                "tasks": list(ORACLE_TASKS),
                "seeds_per_task": args.seeds,
                "oracle_success": oracle,
                "random_success": rand,
                "oracle_mean": mean["oracle"],
                "random_mean": mean["random"],
                "browsers": args.browsers,
                "episodes": args.episodes,
                "episodes_per_s_pool": round(pooled, 2),
                "episodes_per_s_one_browser": round(single, 2),
                "speedup": round(pooled / single, 2),
                "peak_rss_mb_per_browser": round(memory.peak["Rss"] / 2**20, 1),
                "peak_pss_mb_per_browser": round(memory.peak["Pss"] / 2**20, 1),
                "resets": args.resets,
                "reset_s_fresh_context": round(fresh_s, 3),
                "reset_s_kept_page": round(kept_s, 3),
                "isolation_cost_ratio": round(fresh_s / kept_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
