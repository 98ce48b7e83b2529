"""Sandbox throughput: plain subprocess vs cold isolated vs warm pool.

Runs 50 small Python snippets (arithmetic, strings, stdlib imports, short loops)
one at a time, in three ways, interleaved snippet by snippet (the order of the
three rotates) so load swings on a shared machine hit all sides alike:

- plain: ``subprocess.run([sys.executable, "-c", code])``, no isolation (the
  baseline the goals refer to: this process's interpreter as it is launched
  by default, site-packages and all);
- cold:  `Sandbox.run_python`, a new bubblewrap sandbox per snippet;
- warm:  `SandboxPool.run_python`, forked from a pre-started sandboxed server.

A stricter baseline, ``plain_same``, runs the sandbox's own interpreter with
the same ``-I`` flag outside any sandbox, so ``cold_over_plain_same`` isolates
the cost of bubblewrap itself (there is no site-packages start-up to hide it).
Every snippet's stdout must agree across all of them. Prints one JSON line:
executions per second of each (all runs over their total time) and the
throughput ratios ``cold_over_plain`` (goal >= 0.6) and ``warm_over_plain``
(goal > 1), each the median over snippets and rounds of plain time / other
time for the same snippet, which a burst of load elsewhere barely moves.

    .venv/bin/python benchmarks/sandbox.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from temper.sandbox import Sandbox, SandboxConfig, SandboxPool

SNIPPETS = [
    *(f"print({a} * {b} + {a})" for a, b in [(3, 4), (12, 7), (99, 99), (1234, 5678), (7, 0)]),
    *(f"print(sum(range({n})))" for n in (10, 100, 1000, 10_000, 100_000)),
    *(f"print(sorted([{i}, 3, 1, 2], reverse=True))" for i in range(5)),
    *(
        f"print('{w}'.upper()[::-1], len('{w}'))"
        for w in ("alpha", "beta", "gamma", "delta", "eps")
    ),
    *(f"import math; print(round(math.sqrt({n}), 6), math.factorial({n % 20}))" for n in range(5)),
    *(f"import json; print(json.dumps({{'k': {i}, 'v': [1, 2, {i}]}}))" for i in range(5)),
    *(f"import re; print(re.findall(r'\\d+', 'a{i}b{i * 7}c'))" for i in range(5)),
    *(
        f"d = {{}}\nfor i in range({n}):\n    d[i % 7] = d.get(i % 7, 0) + i\nprint(d)"
        for n in (5, 50, 500, 5000, 500)
    ),
    *(
        f"def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib({n}))"
        for n in (5, 10, 15, 18, 3)
    ),
    *(f"print(len(set(str(i) for i in range({n}))))" for n in (1, 10, 100, 1000, 10_000)),
]
assert len(SNIPPETS) == 50


def plain_runner(argv0: list[str]):
    def run(code: str) -> str:
        done = subprocess.run([*argv0, code], capture_output=True, check=False)
        return done.stdout.decode()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds over the snippets")
    args = parser.parse_args()

    config = SandboxConfig(timeout_s=30, allow_fallback=False, pool_size=2)
    cold, warm = Sandbox(config), SandboxPool(config)
    runners = {
        "plain": plain_runner([sys.executable, "-c"]),
        "cold": lambda code: cold.run_python(code).stdout,
        "warm": lambda code: warm.run_python(code).stdout,
        "plain_same": plain_runner([config.python, "-I", "-c"]),
    }
    for run in runners.values():  # warm-up: page cache, pool start-up
        for code in SNIPPETS[:3]:
            run(code)

    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for _ in range(args.reps):
        for i, code in enumerate(SNIPPETS):
            outputs = {}
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                start = time.perf_counter()
                outputs[name] = runners[name](code)
                times[name].append(time.perf_counter() - start)
            if len(set(outputs.values())) != 1:
                raise SystemExit(f"outputs differ for snippet {i}: {outputs}")
    warm.close()

    # Paired by snippet and round, so each ratio compares like with like; the
    # median of the per-snippet ratios shrugs off bursts of load from other
    # processes, which a ratio of totals does not.
    per_s = {name: len(t) / sum(t) for name, t in times.items()}

    def ratio(side: str, base: str) -> float:
        """Throughput of ``side`` over that of ``base``: median of base time / side time."""
        pairs = zip(times[side], times[base], strict=True)
        return round(statistics.median(b / s for s, b in pairs), 3)

    print(
        json.dumps(
            {
                "benchmark": "sandbox",
                "snippets": len(SNIPPETS),
                "reps": args.reps,
                "python": sys.executable,
                "sandbox_python": config.python,
                "plain_per_s": round(per_s["plain"], 1),
                "cold_per_s": round(per_s["cold"], 1),
                "warm_per_s": round(per_s["warm"], 1),
                "plain_same_per_s": round(per_s["plain_same"], 1),
                "cold_over_plain": ratio("cold", "plain"),
                "warm_over_plain": ratio("warm", "plain"),
                "cold_over_plain_same": ratio("cold", "plain_same"),
                "warm_over_plain_same": ratio("warm", "plain_same"),
                "goals": {"cold_over_plain": ">= 0.6", "warm_over_plain": "> 1"},
            }
        )
    )


if __name__ == "__main__":
    main()
