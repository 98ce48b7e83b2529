"""The built-in tool-use environment: procedural questions that need tools.

Four task categories, each answerable only through its tools (the numbers are
too big to do in the head, or hidden behind a lookup):

- ``calc``: "What is 347 * 58?" with a ``calculator``.
- ``lookup``: 'What is the price of "pear"?' with a ``lookup`` tool over a
  small per-task price table the model cannot see.
- ``lookup_calc``: 'How much do 7 of "pear" cost?': ``lookup``, then ``calculator``.
- ``python``: "What is the sum of the digits of 482139?" with a ``python``
  tool that runs code in `temper.sandbox` and returns its output.

An episode: the task's question with its tools; each assistant turn with
``<tool_call>`` blocks gets the tool results (or error messages) back; the
first turn without a tool call is the answer, scored 1.0 if its last
``\\boxed{}`` equals the answer, else 0.0 (``info["success"]``). Tools are
pure functions of the task (the python tool of the code), so episodes are
reproducible. Held-out tasks are split off by a hash of the question.

`transcript(task)` writes the ideal conversation for a task; the tiny model's
pretraining corpus (`scripts/tiny_corpus.py`) uses it, so the model has seen
these tools before RL.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import operator
import random
from typing import Any

from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.envs.tools import Tool, ToolEnv
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards.answers import extract_boxed
from temper.sandbox.service import sandbox_for

CATEGORIES = ("calc", "lookup", "lookup_calc", "python")
ITEMS = ("apple", "pear", "lemon", "melon", "peach", "plum", "grape", "mango", "kiwi", "fig")
HELDOUT_PERCENT = 10
_SALT = "temper-tool-use-v1:"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _schema(description: str, arg: str) -> tuple[str, dict[str, Any]]:
    params = {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}
    return description, params


# Hand-written, terse schemas (not `Tool.from_function`'s): every token of the
# system prompt counts for a small model, and the tiny model saw exactly these.
SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "calculator": _schema("Evaluate an arithmetic expression.", "expression"),
    "lookup": _schema("Look up the price of an item.", "key"),
    "python": _schema("Run Python code; returns what it prints.", "code"),
}
CATEGORY_TOOLS: dict[str, tuple[str, ...]] = {
    "calc": ("calculator",),
    "lookup": ("lookup",),
    "lookup_calc": ("lookup", "calculator"),
    "python": ("python",),
}


def _tool(name: str, fn: Any) -> Tool:
    description, params = SCHEMAS[name]
    return Tool(name, description, params, fn)


def tool_schemas(category: str) -> list[dict[str, Any]]:
    """The OpenAI-format schemas of a category's tools, in prompt order."""
    return [_tool(name, None).schema for name in CATEGORY_TOOLS[category]]


def calculator(expression: str) -> dict[str, int]:
    """Evaluate an arithmetic expression.

    Args:
        expression: integers with + - * and parentheses, e.g. "12*(3+4)".
    """

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression {expression!r}: use integers with + - * ( )")

    if len(expression) > 200:
        raise ValueError("expression too long (over 200 characters)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse expression {expression!r}") from None
    return {"result": ev(tree.body)}


def _lookup_tool(table: dict[str, int]) -> Tool:
    def lookup(key: str) -> dict[str, int]:
        if key not in table:
            raise KeyError(f"unknown key {key!r}; known keys: {', '.join(sorted(table))}")
        return {"value": table[key]}

    return _tool("lookup", lookup)


def _python_tool(sandbox: Any) -> Tool:
    async def python(code: str) -> str:
        result = await sandbox.arun_python(code)
        out = result.stdout.strip()
        if result.exit_code != 0 or result.timed_out:
            err = result.stderr.strip().splitlines()[-1:]
            return f"error (exit {result.exit_code}): {' '.join(err) or 'timed out'}"
        return out

    return _tool("python", python)


def _question(category: str, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    """(question, answer, columns) of one task of ``category``."""
    if category == "calc":
        if rng.random() < 0.5:
            a, b, op = rng.randint(100, 999), rng.randint(10, 99), "*"
        else:
            a, b, op = rng.randint(1000, 9999), rng.randint(1000, 9999), "+"
        value = a * b if op == "*" else a + b
        return f"What is {a} {op} {b}?", str(value), {"expression": f"{a}{op}{b}"}
    if category == "python":
        n = rng.randint(10**5, 10**6 - 1)
        return f"What is the sum of the digits of {n}?", str(sum(map(int, str(n)))), {"n": n}
    items = rng.sample(ITEMS, 4)
    table = {item: rng.randint(2, 99) for item in items}
    item = rng.choice(items)
    # The item is quoted so it is the same token(s) in the question and in the
    # tool call's JSON: a small model copies it far more reliably.
    if category == "lookup":
        return f'What is the price of "{item}"?', str(table[item]), {"table": table, "item": item}
    count = rng.randint(3, 19)
    question = f'How much do {count} of "{item}" cost?'
    answer = str(count * table[item])
    return question, answer, {"table": table, "item": item, "count": count}


def is_heldout(question: str) -> bool:
    digest = hashlib.sha256((_SALT + question).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def make_task(category: str, rng: random.Random, heldout: bool = False) -> Task:
    """A task of ``category`` from the training split (or the held-out one)."""
    for _ in range(10_000):
        question, answer, columns = _question(category, rng)
        if is_heldout(question) == heldout:
            key = hashlib.sha256(question.encode()).hexdigest()[:12]
            return Task(f"tool-{category}-{key}", question, answer, category, columns)
    raise RuntimeError(f"could not draw a {category} task from the requested split")


class ToolUseTasks:
    """Procedural tool-use tasks over ``categories`` (a ``ProceduralSampler`` generator)."""

    def __init__(self, categories: tuple[str, ...] = CATEGORIES) -> None:
        unknown = [c for c in categories if c not in CATEGORIES]
        if unknown or not categories:
            raise ConfigError(
                f"env.options.categories must be a non-empty subset of {list(CATEGORIES)}, "
                f"got {list(categories)}"
            )
        self.categories = tuple(categories)

    def sample(self, rng: random.Random, k: int) -> list[Task]:
        return [make_task(rng.choice(self.categories), rng) for _ in range(k)]

    def heldout(self, n: int, seed: int = 1234) -> list[Task]:
        """n held-out tasks, categories round-robin (fixed for a given n and seed)."""
        rng = random.Random(seed)
        return [make_task(self.categories[i % len(self.categories)], rng, True) for i in range(n)]


def tools_for(task: Task, sandbox: Any = None) -> list[Tool]:
    """The tools a task's category offers (the python tool runs code in ``sandbox``)."""
    tools: list[Tool] = []
    for name in CATEGORY_TOOLS[task.category]:
        if name == "lookup":
            tools.append(_lookup_tool(task.columns["table"]))
        elif name == "calculator":
            tools.append(_tool("calculator", calculator))
        else:
            if sandbox is None:  # the caller owns (and closes) the sandbox
                raise ValueError(f"task {task.id}: the python tool needs a sandbox")
            tools.append(_python_tool(sandbox))
    return tools


def tool_latency_s(rng: random.Random, low_ms: float, high_ms: float) -> float:
    """A long-tailed latency in seconds: Pareto (shape 1) truncated to [low_ms, high_ms].

    Most calls take about ``low_ms``; a few take up to ``high_ms`` (for 50-500 ms
    the median is about 91 ms and the mean about 128 ms).
    """
    u = rng.random()
    return low_ms / (1.0 - u * (1.0 - low_ms / high_ms)) / 1000.0


class ToolUseEnv(ToolEnv):
    """One tool-use episode (see the module doc); a fresh instance per episode.

    ``latency_ms = (low, high)`` makes every turn with tool calls wait a
    long-tailed time (`tool_latency_s`), drawn from the episode seed, as remote
    tools do; it exists to exercise asynchronous training.
    """

    def __init__(
        self,
        task: Task,
        sandbox: Any = None,
        tool_timeout_s: float = 10.0,
        latency_ms: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(tools_for(task, sandbox), tool_timeout_s=tool_timeout_s)
        self._answer = str(task.answer)
        self._latency = latency_ms
        self._rng = random.Random(0)

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        self._rng.seed(seed)
        return [{"role": "user", "content": str(task.prompt)}]

    async def step(self, turn: AssistantTurn) -> StepResult:
        result = await super().step(turn)
        if self._latency is not None and not result.done:
            delay = tool_latency_s(self._rng, *self._latency)
            await asyncio.sleep(delay)
            result.metrics["tool_latency_s"] = delay
        return result

    async def answer(self, turn: AssistantTurn) -> StepResult:
        boxed = extract_boxed(turn.text)
        success = boxed is not None and boxed.strip() == self._answer
        return StepResult([], reward=1.0 if success else 0.0, done=True, info={"success": success})


def transcript(task: Task) -> list[Message]:
    """The ideal conversation for ``task``: the tool calls, their results, the boxed answer."""
    cols = task.columns
    msgs: list[Message] = [{"role": "user", "content": str(task.prompt)}]

    def call(name: str, arguments: dict[str, Any], result: Any) -> None:
        fn = {"name": name, "arguments": arguments}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{"function": fn}]})
        content = result if isinstance(result, str) else json.dumps(result)
        msgs.append({"role": "tool", "content": content})

    if task.category == "calc":
        call("calculator", {"expression": cols["expression"]}, calculator(cols["expression"]))
        final = f"The calculator says {task.answer}."
    elif task.category == "python":
        code = f"print(sum(int(d) for d in '{cols['n']}'))"
        call("python", {"code": code}, str(task.answer))
        final = f"The program printed {task.answer}."
    else:
        item, price = cols["item"], cols["table"][cols["item"]]
        call("lookup", {"key": item}, {"value": price})
        final = f'"{item}" costs {price}.'
        if task.category == "lookup_calc":
            expression = f"{cols['count']}*{price}"
            call("calculator", {"expression": expression}, calculator(expression))
            final = f'{cols["count"]} of "{item}" cost {task.answer}.'
    msgs.append({"role": "assistant", "content": f"{final} \\boxed{{{task.answer}}}"})
    return msgs


def _latency_option(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    ok = isinstance(value, list | tuple) and len(value) == 2
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not ok or not 0 < value[0] <= value[1]:
        raise ConfigError(
            f"env.options.tool_latency_ms must be [low, high] with 0 < low <= high, got {value!r}"
        )
    return float(value[0]), float(value[1])


def spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory. Options: ``categories`` (list), ``eval_size`` (int, default 200),
    ``tool_timeout_s`` (float, default 10), ``tool_latency_ms`` ([low, high], default
    none: see `ToolUseEnv`)."""
    from temper.data.sampler import ProceduralSampler

    allowed = {"categories", "eval_size", "tool_timeout_s", "tool_latency_ms", "sandbox_servers"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"env.options: unknown option(s) {unknown} for tool_use; allowed {sorted(allowed)}"
        )
    latency = _latency_option(options.get("tool_latency_ms"))
    tasks = ToolUseTasks(tuple(options.get("categories", CATEGORIES)))
    timeout = float(options.get("tool_timeout_s", 10.0))
    sandbox_box: list[Any] = []

    servers = options.get("sandbox_servers") or []
    if not isinstance(servers, list) or not all(
        isinstance(u, str) and u.startswith(("ws://", "wss://")) for u in servers
    ):
        raise ConfigError(
            f"env.options.sandbox_servers must be a list of ws:// URLs, got {servers!r}"
        )

    def shared_sandbox() -> Any:
        if not sandbox_box:
            from temper.sandbox import Sandbox

            sandbox_box.append(sandbox_for(servers, Sandbox))
        return sandbox_box[0]

    def make_env(task: Task) -> ToolUseEnv:
        sandbox = shared_sandbox() if task.category == "python" else None
        return ToolUseEnv(task, sandbox, timeout, latency)

    def close() -> None:
        for sandbox in sandbox_box:
            sandbox.close()

    return EnvSpec(
        make_env=make_env,
        train=ProceduralSampler(tasks, seed),
        heldout=tasks.heldout(int(options.get("eval_size", 200))),
        close=close,
    )
