"""Fuzz the surfaces that read untrusted input; print how many cases each took and failed.

Surfaces:

- ``tool_calls``: model text through `parse_tool_calls`, `execute_tool_calls`
  (with a real tool) and the ``tool_call_ast`` reward. A failure is any raised
  exception, or a parsed call whose arguments ``json.dumps`` cannot write.
- ``config``: dotted overrides and whole TOML files through `load_config`. A
  failure is any exception other than a one-line `ConfigError`.
- ``serve``: bodies POSTed to ``temper serve`` (the tiny model on the native
  engine, on 127.0.0.1) at ``/v1/chat/completions`` and ``/v1/completions``.
- ``serve_rm``: bodies POSTed to ``temper serve-rm`` (``tiny-rm``) at ``/score``.

For the servers a failure is a 5xx, a 4xx whose body is not the server's JSON
error with a one-line message, or a dropped connection; the server must still
answer ``/health`` at the end. Cases are mutations of valid inputs: a node of
the JSON replaced by a hostile value (nesting thousands deep, a 5,000-digit
integer, NaN, 1e999, lone surrogates, wrong types, huge or empty values), keys
dropped or added, and byte-level edits (flips, cuts, hostile fragments).
Seeded, so a run repeats.

    .venv/bin/python scripts/fuzz_inputs.py [--cases 3000] [--seed 0] [--only serve,config]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HUGE_INT = "9" * 5000
# Placeholders that json.dumps writes as strings and `_render` swaps for raw text
# json.dumps cannot produce (a 5,000-digit integer is over Python's str limit).
RAW = {
    '"__HUGE_INT__"': HUGE_INT,
    '"__DEEP__"': "[" * 3000 + "]" * 3000,
    '"__DEEP_OPEN__"': "[" * 100_000,
    '"__DEEP_OBJ__"': '{"a":' * 2000 + "1" + "}" * 2000,
    '"__NAN__"': "NaN",
    '"__INF__"': "1e999",
    '"__NEG_INF__"': "-Infinity",
    '"__SURROGATE__"': '"\\ud800x"',
    '"__LOW_SURROGATE__"': '"a\\udfff"',
}
HOSTILE_VALUES: list[Any] = [
    *[k.strip('"') for k in RAW],
    None, True, False, 0, -1, 2**63, -(2**64), 10**30, 1.5, -0.0, 1e308, "", "x" * 20_000,
    [], {}, [[]], [None], [1, "a"], {"role": "user"}, "\ud800", "\x00", "\u202e",
    [[[[[[[[[[1]]]]]]]]]], list(range(50)), {"type": "text", "text": 5},
]  # fmt: skip
FRAGMENTS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\\u", b"\\ud800", b"\xff",
             b"\xed\xa0\x80", b"\x00", b"NaN", b"1e999", HUGE_INT.encode(), b"[" * 2000,
             b"<tool_call>", b"</tool_call>", b"null", b"-", b"\r\n"]  # fmt: skip


def _render(value: Any) -> bytes:
    text = json.dumps(value)
    for key, raw in RAW.items():
        text = text.replace(key, raw)
    return text.encode()


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


def mutate_json(rng: random.Random, valid: Any) -> bytes:
    """One hostile variant of the JSON value ``valid``, as bytes."""
    value = valid
    for _ in range(rng.choice([1, 1, 2, 3])):
        path = rng.choice(_paths(value))
        kind = rng.random()
        if kind < 0.6:
            value = _replace(value, path, rng.choice(HOSTILE_VALUES))
        elif kind < 0.75 and path:
            parent = _replace(value, (), value)
            container = parent
            for p in path[:-1]:
                container = container[p]
            if isinstance(container, dict):
                value = _replace(
                    value, path[:-1], {k: v for k, v in container.items() if k != path[-1]}
                )
        elif kind < 0.9:
            target = value
            for p in path:
                target = target[p]
            if isinstance(target, dict):
                value = _replace(value, path, {**target, rng.choice(["x", "\ud800", ""]): 1})
    raw = _render(value)
    if rng.random() < 0.3:
        raw = mutate_bytes(rng, raw)
    return raw


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(data) + 1)
        op = rng.random()
        if op < 0.3 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op < 0.6:
            data[pos:pos] = rng.choice(FRAGMENTS)
        elif op < 0.8:
            del data[pos : pos + rng.randint(1, 8)]
        else:
            del data[pos:]
    return bytes(data)


# ----------------------------------------------------------------------- surfaces


def fuzz_tool_calls(rng: random.Random, cases: int) -> Counter:
    from temper.envs import AssistantTurn, Tool, execute_tool_calls, parse_tool_calls
    from temper.records import Task
    from temper.rewards.base import RewardInput
    from temper.rewards.tool_call_ast import ToolCallASTReward

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    tools = {"add": Tool.from_function(add)}
    reward = ToolCallASTReward()
    task = Task(id="t", prompt="q", columns={"ground_truth": [{"add": {"a": [2], "b": [3]}}]})
    valid = {"name": "add", "arguments": {"a": 2, "b": 3}}
    counts: Counter = Counter()
    for _ in range(cases):
        counts["cases"] += 1
        body = mutate_json(rng, valid).decode("utf-8", "replace")
        text = f"I will call it.\n<tool_call>{body}</tool_call>"
        if rng.random() < 0.3:
            text = mutate_bytes(rng, text.encode()).decode("utf-8", "replace")
        if rng.random() < 0.2:
            text = f"[add(a={rng.choice(['1', HUGE_INT, '[' * 500, 'x'])})]"
        try:
            calls, errors = parse_tool_calls(text)
            for call in calls:
                json.dumps(call.arguments)
            turn = AssistantTurn(text, [], calls, errors, "stop", 0)
            messages, _ = asyncio.run(execute_tool_calls(tools, turn, timeout_s=5))
            assert all(isinstance(m["content"], str) for m in messages)
            counts["parsed_ok" if calls and not errors else "parse_errors"] += 1
            asyncio.run(reward.score([RewardInput(task, "q", text)]))
        except Exception as exc:
            counts["failures"] += 1
            counts[f"failure:{type(exc).__name__}"] += 1
    return counts


def fuzz_config(rng: random.Random, cases: int) -> Counter:
    from temper.config import load_config
    from temper.errors import ConfigError

    keys = ["run.name", "trainer.lr", "orchestrator.steps", "env.options.x", "data.levels",
            "algo.advantage", "run", "x.y.z"]  # fmt: skip
    valid_file = {"run": {"name": "fuzz"}, "trainer": {"lr": 1e-4}, "data": {"levels": [1, 2]}}
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        for i in range(cases):
            counts["cases"] += 1
            try:
                if i % 2:
                    raw = mutate_json(rng, rng.choice(HOSTILE_VALUES)).decode("utf-8", "replace")
                    value = raw if rng.random() < 0.5 else raw.replace('"', "")
                    load_config(None, [f"{rng.choice(keys)}={value}"])
                else:
                    path.write_bytes(_toml_variant(rng, valid_file))
                    load_config(path)
                counts["accepted"] += 1
            except ConfigError as exc:
                counts["config_errors"] += 1
                if "\n" in str(exc):
                    counts["failures"] += 1
                    counts["failure:multi-line message"] += 1
            except Exception as exc:
                counts["failures"] += 1
                counts[f"failure:{type(exc).__name__}"] += 1
    return counts


def _toml_variant(rng: random.Random, valid: dict) -> bytes:
    import tomli_w

    lines = tomli_w.dumps(valid).encode()
    key = rng.choice([b"name", b"lr", b"levels"])
    value = rng.choice([HUGE_INT.encode(), b"[" * 3000 + b"]" * 3000, b"{a=" * 2000 + b"1" + b"}" * 2000,
                        b'"\\ud800"', b"'caf\xe9'", b"inf", b"nan", b"1979-05-27", b"[1, 'a']"])  # fmt: skip
    lines = lines.replace(key + b" = ", key + b" = " + value + b"\n#", 1)
    return mutate_bytes(rng, lines) if rng.random() < 0.4 else lines


def _check_reply(reply: Any, counts: Counter, error_keys: set[str]) -> None:
    counts[f"status_{reply.status_code}"] += 1
    if reply.status_code >= 500:
        counts["failures"] += 1
        counts[f"failure:{reply.status_code} {reply.text[:80]}"] += 1
        return
    if reply.status_code >= 400:
        try:
            err = reply.json()["error"]
            assert set(err) >= error_keys and "\n" not in err["message"]
        except Exception:
            counts["failures"] += 1
            counts[f"failure:bad error body {reply.text[:80]}"] += 1


def fuzz_http(
    rng: random.Random, cases: int, url: str, bodies: list[tuple[str, Any]], error_keys: set[str]
) -> Counter:
    import httpx

    counts: Counter = Counter()
    with httpx.Client(timeout=120) as http:
        for _ in range(cases):
            counts["cases"] += 1
            path, valid = rng.choice(bodies)
            raw = mutate_json(rng, valid)
            try:
                reply = http.post(
                    url + path, content=raw, headers={"content-type": "application/json"}
                )
            except httpx.HTTPError as exc:
                counts["failures"] += 1
                counts[f"failure:{type(exc).__name__}"] += 1
                continue
            _check_reply(reply, counts, error_keys)
        health = http.get(url + "/health")
        counts["health_after"] = health.status_code
        if health.status_code != 200:
            counts["failures"] += 1
    return counts


def fuzz_serve(rng: random.Random, cases: int) -> Counter:
    from temper.engine.native import NativeEngine
    from temper.models import load_model, load_tokenizer
    from temper.serve import start_server

    tok = load_tokenizer("tiny")
    engine = NativeEngine(load_model("tiny"), tok)
    chat = {"model": "tiny", "max_tokens": 2, "n": 1, "temperature": 0.5, "seed": 1,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "2+3?"}]}],
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
            "stop": ["\n"], "logprobs": True}  # fmt: skip
    completion = {"model": "tiny", "max_tokens": 2, "prompt": ["Hello", "Hi"], "logprobs": 0}
    ids = {"model": "tiny", "max_tokens": 2, "prompt": [[1, 2, 3], [4, 5]], "stop_token_ids": [7]}
    bodies = [("/v1/chat/completions", chat), ("/v1/completions", completion),
              ("/v1/completions", ids)]  # fmt: skip
    with start_server(engine, tok, model_name="tiny") as handle:
        return fuzz_http(rng, cases, handle.url, bodies, {"message", "type", "param", "code"})


def fuzz_serve_rm(rng: random.Random, cases: int) -> Counter:
    from temper.rewards.rm_batcher import load_reward_model
    from temper.serve.reward_model import start_rm_server

    handle, _ = start_rm_server(load_reward_model("tiny-rm"), max_batch_size=32, max_wait_ms=2)
    body = {"pairs": [{"prompt": "What is 2+3?", "response": "5"},
                      {"prompt": "Name a colour.", "response": "Blue."}]}  # fmt: skip
    try:
        return fuzz_http(rng, cases, handle.url, [("/score", body)], {"message", "type"})
    finally:
        handle.stop()


SURFACES: dict[str, Callable[[random.Random, int], Counter]] = {
    "tool_calls": fuzz_tool_calls,
    "config": fuzz_config,
    "serve": fuzz_serve,
    "serve_rm": fuzz_serve_rm,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000, help="cases per surface")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(SURFACES), help="comma-separated surfaces")
    args = parser.parse_args()
    import logging

    logging.disable(logging.CRITICAL)  # 500s would log tracebacks; they are counted instead
    total_failures = 0
    for name in args.only.split(","):
        start = time.monotonic()
        counts = SURFACES[name](random.Random(f"{args.seed}:{name}"), args.cases)
        total_failures += counts["failures"]
        line = {"surface": name, "seconds": round(time.monotonic() - start, 1), **counts}
        line.setdefault("failures", 0)
        print(json.dumps(line), flush=True)
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
