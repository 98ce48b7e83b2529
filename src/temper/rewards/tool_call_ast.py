"""Tool-call AST matching (BFCL-style): do a model's tool calls equal the expected ones?

The expected calls use BFCL's `possible_answer` format: a list with one
``{function_name: {arg: [allowed values]}}`` per call. A model's calls match
when there are as many calls as expected and they pair up one-to-one, in any
order (parallel calls), such that for each pair:

- the function names are equal;
- every argument the function's schema marks required is present;
- no argument is unknown (absent from the expected call, or from the schema);
- every expected argument is present unless ``""`` is among its allowed
  values (``""`` marks an optional argument that may be left out);
- each given value has the schema's type (an int is accepted for a float;
  a bool is never a number) or the type of the allowed values (BFCL writes
  some answers as strings for non-string parameters), and equals one allowed value.

Equality follows BFCL: strings compare after dropping spaces and the
characters ``,./-_*^``, lowercasing, and turning ``'`` into ``"``; numbers
compare by value; lists compare element by element, in order; an allowed
value that is a dict is itself ``{key: [allowed values]}`` and is matched key
by key the same way (keys may be left out when ``""`` is allowed).

The score is binary (1.0 or 0.0); the first failure is explained in a reason
string such as ``"f: wrong value for arg 'x': 3 not in [4]"``. The schema
(BFCL's or OpenAI's function format) is optional: without it, types are not
checked and the required arguments are the expected ones without ``""``.

Model output is read as Hermes ``<tool_call>{json}</tool_call>`` blocks (the
parser of `temper.envs.tools`) or, without such blocks, as BFCL's Python call
syntax ``[func(a=1, b='x'), mod.g(c=[1, 2])]``, parsed with `ast` and read
with `ast.literal_eval` (nothing is ever evaluated).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from temper import safe_json
from temper.models.tool_calls import ToolCall, parse_tool_calls
from temper.rewards.base import RewardDefaults, RewardInput, RewardResult

#: An expected call: (function name, {argument: allowed values}).
Expected = tuple[str, dict[str, list[Any]]]


@dataclass(frozen=True)
class Verdict:
    """The outcome of matching: `score` 1.0 or 0.0; `reason` says why it is 0.0."""

    score: float
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.score == 1.0


# ---------------------------------------------------------------- parsing


class ToolCallSyntaxError(ValueError):
    """Model output that holds no readable tool call; the message says what is wrong."""


_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)


def _dotted_name(node: ast.expr) -> str:
    """`f` or `a.b.f` from a call's function expression."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise ToolCallSyntaxError(f"a call's function must be a name, got {ast.unparse(node)!r}")


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (a JSON answer has no tuples)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _call_from_node(node: ast.expr, index: int) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise ToolCallSyntaxError(f"item {index} is not a function call: {ast.unparse(node)!r}")
    name = _dotted_name(node.func)
    if node.args:
        raise ToolCallSyntaxError(f"call {name!r} has positional arguments; use name=value")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ToolCallSyntaxError(f"call {name!r} uses **kwargs")
        try:
            args[kw.arg] = _plain(ast.literal_eval(kw.value))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            value = ast.unparse(kw.value)[:80]
            raise ToolCallSyntaxError(
                f"argument {kw.arg!r} of {name!r} is not a literal: {value}"
            ) from None
    return ToolCall(name, args, index, f"call_{index}", ast.unparse(node))


def parse_python_calls(text: str) -> list[ToolCall]:
    """Calls written as a Python list of calls, ``[f(a=1), g.h(b='x')]`` (or one bare call).

    A surrounding code fence is ignored; if the whole text does not parse,
    the span from its first ``[`` to its last ``]`` is tried. Arguments must be
    keywords with literal values. Raises `ToolCallSyntaxError` otherwise.
    """
    src = text.strip()
    fenced = _FENCE.match(src)
    if fenced:
        src = fenced.group(1).strip()
    candidates = [src]
    if "[" in src and "]" in src:
        candidates.append(src[src.index("[") : src.rindex("]") + 1])
    tree = None
    for candidate in candidates:
        try:
            tree = ast.parse(candidate, mode="eval")
            break
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    if tree is None:
        raise ToolCallSyntaxError("not a Python list of calls like [func(arg=value)]")
    body = tree.body
    nodes = body.elts if isinstance(body, ast.List | ast.Tuple) else [body]
    return [_call_from_node(node, i) for i, node in enumerate(nodes)]


def extract_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls in a model's output: Hermes blocks if any, else Python call syntax.

    Raises `ToolCallSyntaxError` naming the problem when a Hermes block is
    malformed or the text is neither format.
    """
    if "<tool_call>" in text:
        calls, errors = parse_tool_calls(text)
        if errors:
            raise ToolCallSyntaxError(f"malformed tool call: {errors[0].message}")
        return calls
    try:
        return parse_python_calls(text)
    except ToolCallSyntaxError as exc:
        raise ToolCallSyntaxError(
            f"no tool call found ({exc}); expected <tool_call>{{...}}</tool_call> "
            "or [func(arg=value)]"
        ) from None


# ------------------------------------------------------- ground truth, schemas


def parse_expected(ground_truth: Any) -> list[Expected]:
    """BFCL ground truth (a list of ``{name: {arg: [allowed]}}``, or its JSON) as pairs.

    Raises ValueError with one line when the shape is wrong (or the JSON is not
    usable: `temper.safe_json.loads`).
    """
    if isinstance(ground_truth, str):
        ground_truth = safe_json.loads(ground_truth)
    if not isinstance(ground_truth, list):
        raise ValueError("ground truth must be a list of {function: {arg: [allowed values]}}")
    out: list[Expected] = []
    for i, entry in enumerate(ground_truth):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f"ground truth call {i} must be a dict with exactly one function")
        ((name, args),) = entry.items()
        if not isinstance(args, dict) or not all(isinstance(v, list) for v in args.values()):
            raise ValueError(f"ground truth call {i} ({name}): each arg needs a list of values")
        out.append((name, args))
    return out


def function_parameters(functions: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """{name: parameters schema} from BFCL or OpenAI-format function descriptions.

    Raises ValueError naming the entry when one has no string "name" or its
    parameters are not an object.
    """
    out: dict[str, Any] = {}
    for i, fn in enumerate(functions or []):
        spec = (
            fn.get("function", fn)
            if isinstance(fn, Mapping) and fn.get("type") == "function"
            else fn
        )
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            raise ValueError(f'function {i} must be an object with a string "name"')
        params = spec.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise ValueError(f"function {i} ({spec['name']}): parameters must be an object")
        out[spec["name"]] = params
    return out


# ---------------------------------------------------------------- matching

_STRIP = re.compile(r"[ ,./\-_*^]")

# Schema type name -> accepted Python types. Unknown names (e.g. BFCL's "any")
# are not checked.
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "float": (int, float),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "tuple": (list,),
    "dict": (dict,),
    "object": (dict,),
}


def normalize_string(text: str) -> str:
    """BFCL's lenient string form: no spaces or ``,./-_*^``, lowercase, ``'`` as ``"``."""
    return _STRIP.sub("", text).lower().replace("'", '"')


def _is_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # bool is an int subclass: never a number here
        return bool in types
    return isinstance(value, types)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def value_matches(value: Any, allowed: Any) -> bool:
    """Whether `value` equals one allowed value `allowed` under BFCL's rules (see module doc)."""
    if isinstance(allowed, dict):
        return isinstance(value, dict) and dict_matches(value, allowed) is None
    if isinstance(allowed, list):
        return (
            isinstance(value, list)
            and len(value) == len(allowed)
            and all(value_matches(v, a) for v, a in zip(value, allowed, strict=True))
        )
    if isinstance(allowed, str):
        return isinstance(value, str) and normalize_string(value) == normalize_string(allowed)
    if isinstance(allowed, bool) or isinstance(value, bool):
        return type(value) is type(allowed) and value == allowed
    if allowed is None:
        return value is None
    return isinstance(value, int | float) and value == allowed


def dict_matches(value: Mapping[str, Any], allowed: Mapping[str, Any]) -> str | None:
    """None when dict `value` fits ``{key: [allowed values]}``; else what does not."""
    for key, item in value.items():
        if key not in allowed:
            return f"unexpected key {key!r}"
        alts = allowed[key] if isinstance(allowed[key], list) else [allowed[key]]
        if not any(value_matches(item, a) for a in alts):
            return f"key {key!r}: {_short(item)} not in {_short(alts)}"
    for key, alts in allowed.items():
        if key not in value and not (isinstance(alts, list) and "" in alts):
            return f"missing key {key!r}"
    return None


def _type_problem(name: str, value: Any, prop: Mapping[str, Any], alts: list[Any]) -> str | None:
    kind = prop.get("type")
    if not isinstance(kind, str) or kind not in _TYPES or _is_type(value, _TYPES[kind]):
        return None
    # BFCL writes some answers (e.g. variable names) as strings for typed params.
    if any(a != "" and type(a) is type(value) for a in alts):
        return None
    return f"wrong type for arg {name!r}: expected {kind}, got {type(value).__name__}"


def check_call(
    call: ToolCall, expected: Expected, parameters: Mapping[str, Any] | None
) -> str | None:
    """None when `call` matches `expected`; else the first reason it does not."""
    name, allowed = expected
    if call.name != name:
        return f"wrong function {call.name!r}, expected {name!r}"
    props = (parameters or {}).get("properties", {})
    if parameters is not None:
        required = parameters.get("required", [])
    else:
        required = [a for a, alts in allowed.items() if "" not in alts]
    for arg in required:
        if arg not in call.arguments:
            return f"{name}: missing required arg {arg!r}"
    for arg, value in call.arguments.items():
        if arg not in allowed or (parameters is not None and arg not in props):
            return f"{name}: unknown arg {arg!r}"
        alts = allowed[arg]
        problem = _type_problem(arg, value, props.get(arg, {}), alts)
        if problem:
            return f"{name}: {problem}"
        if not any(value_matches(value, a) for a in alts):
            shown = [a for a in alts if a != ""]
            reason = f"{name}: wrong value for arg {arg!r}: {_short(value)} not in {_short(shown)}"
            if isinstance(value, dict) and len(shown) == 1 and isinstance(shown[0], dict):
                reason += f" ({dict_matches(value, shown[0])})"  # which key is wrong
            return reason
    for arg, alts in allowed.items():
        if arg not in call.arguments and "" not in alts:
            return f"{name}: missing arg {arg!r}"
    return None


def _max_matching(ok: list[list[bool]]) -> dict[int, int]:
    """A maximum pairing {row: column} with ok[row][column], each column used once.

    Augmenting paths (Kuhn's algorithm): a greedy first fit could strand a row
    that another pairing would satisfy.
    """
    owner: dict[int, int] = {}  # column -> row

    def place(i: int, seen: set[int]) -> bool:
        for j, good in enumerate(ok[i]):
            if good and j not in seen:
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(ok)):
        place(i, set())
    return {i: j for j, i in owner.items()}


def match_calls(
    calls: Sequence[ToolCall],
    expected: Sequence[Expected],
    functions: Sequence[Mapping[str, Any]] | None = None,
) -> Verdict:
    """Match parsed calls against expected ones, in any order (see module doc)."""
    if len(calls) != len(expected):
        return Verdict(0.0, f"expected {len(expected)} call(s), got {len(calls)}")
    params = function_parameters(functions) if functions else None

    def schema_of(name: str) -> Mapping[str, Any] | None:
        return None if params is None else params.get(name)

    reasons = [[check_call(c, e, schema_of(e[0])) for c in calls] for e in expected]
    pairs = _max_matching([[r is None for r in row] for row in reasons])
    if len(pairs) == len(expected):
        return Verdict(1.0)
    # Explain the first expected call left over, against the calls left over
    # (preferring one to the same function).
    i = next(i for i in range(len(expected)) if i not in pairs)
    left = [j for j in range(len(calls)) if j not in pairs.values()]
    same = [j for j in left if calls[j].name == expected[i][0]]
    reason = reasons[i][(same or left)[0]]
    if len(expected) == 1:
        return Verdict(0.0, reason)
    return Verdict(0.0, f"expected call {i} matches no call: {reason}")


def check_tool_calls(
    text: str, ground_truth: Any, functions: Sequence[Mapping[str, Any]] | None = None
) -> Verdict:
    """Score a model's output text against BFCL ground truth (see module doc).

    Unreadable output scores 0.0 with the parse problem as the reason; a
    malformed `ground_truth` raises ValueError.
    """
    expected = parse_expected(ground_truth)
    try:
        calls = extract_tool_calls(text)
    except ToolCallSyntaxError as exc:
        return Verdict(0.0, str(exc))
    return match_calls(calls, expected, functions)


class ToolCallASTReward(RewardDefaults):
    """Reward: 1.0 when the completion's tool calls match the task's expected calls.

    The expected calls come from the task column `ground_truth_field` (BFCL
    format, a list or its JSON); the function schemas, optional, from
    `functions_field` (a list or its JSON; a task without it is checked
    against the ground truth alone). Components: the score under `name`, and
    ``"parses"`` (1.0 when a tool call could be read). A task whose ground
    truth is missing or malformed gets a result with `error` set.
    """

    def __init__(
        self,
        ground_truth_field: str = "ground_truth",
        functions_field: str = "functions",
        *,
        name: str = "tool_call_ast",
    ) -> None:
        self.ground_truth_field = ground_truth_field
        self.functions_field = functions_field
        self.name = name

    def _score_one(self, item: RewardInput) -> RewardResult:
        columns = item.task.columns
        try:
            if self.ground_truth_field not in columns:
                raise ValueError(f"task has no column {self.ground_truth_field!r}")
            expected = parse_expected(columns[self.ground_truth_field])
            functions = columns.get(self.functions_field)
            if isinstance(functions, str):
                functions = safe_json.loads(functions)
            if functions is not None and not isinstance(functions, list):
                raise ValueError(f"column {self.functions_field!r} is not a list of functions")
            function_parameters(functions)  # a malformed entry is the task's error
        except ValueError as exc:
            return RewardResult(score=0.0, error=f"task {item.task.id!r}: bad ground truth: {exc}")
        try:
            calls = extract_tool_calls(item.completion_text)
        except ToolCallSyntaxError:
            return RewardResult(0.0, {self.name: 0.0, "parses": 0.0}, correct=False)
        verdict = match_calls(calls, expected, functions)
        return RewardResult(
            verdict.score, {self.name: verdict.score, "parses": 1.0}, correct=verdict.ok
        )

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return [self._score_one(item) for item in inputs]
