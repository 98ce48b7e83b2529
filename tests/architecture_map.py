"""The house as the code has it: floors, imports, construction sites, probes and sizes.

Read from the source with `ast` (nothing is imported or run), for
tests/test_architecture.py and for people: ``python tests/architecture_map.py``
prints every table. The floors below are the ones docs/architecture.md shows.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "temper"

#: Each top-level part of `temper`, on its floor (1 = the ground). A module may import
#: its own part, and parts on lower floors; never a part on its own floor or above.
FLOORS: dict[str, int] = {
    **dict.fromkeys(
        ["errors", "safe_json", "processes", "compute", "torch_extensions", "records", "algos"],
        1,
    ),
    **dict.fromkeys(["devices", "targets", "http_client", "_subprocess_site", "config", "wire"], 2),
    **dict.fromkeys(["models", "vision", "weights", "sandbox", "ray_cluster"], 3),
    **dict.fromkeys(["engine", "monitor", "rewards"], 4),
    "data": 5,
    "envs": 6,
    **dict.fromkeys(["rollout", "trainer", "serve"], 7),
    **dict.fromkeys(["eval", "backends", "agents"], 8),
    "builder": 9,
    "orchestrator": 10,
    "api": 11,
    "cli": 12,
    "__main__": 13,
}
#: `temper/__init__.py`, the package's face, stands apart from the floors: every import
#: of a module passes through it, it holds ``__version__`` (the CLI reads it), and it
#: lends `temper.train` and friends from `temper.api` lazily (PEP 562).
FACE = "__init__"

#: Imports that run up a floor, each with why it is right. None are left.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}

#: Components built from config, and the only places that construct them: the builder,
#: or the component's own part (a classmethod, a composite of its own kind).
BUILT_BY_BUILDER = {
    "engine": ["NativeEngine", "HFEngine", "VLLMEngine", "OpenAIEndpointEngine"],
    "rewards": [
        "MathVerifyReward",
        "FormatReward",
        "ExactMatchReward",
        "JSONSchemaReward",
        "OverlongPenalty",
        "TRLRewardFunction",
        "JudgeReward",
        "RewardModelReward",
        "ToolCallASTReward",
        "WeightedSum",
        "GatedReward",
    ],
    "data": ["AdaptiveSampler"],
    "rollout": ["SingleTurnRollouts", "EpisodeRollouts"],
    "trainer": ["PolicyTrainer", "DistributedTrainer", "Critic"],
    "backends": ["LocalBackend", "RemoteBackend", "WorkerPool", "RayWorkerPool"],
    "monitor": ["TensorBoardSink", "WandbSink", "MlflowSink"],
}

#: getattr/hasattr on objects Temper does not define (HF models and configs, user code,
#: the standard library, Ray's exceptions), per file: how many, and on what.
FOREIGN_PROBES: dict[str, tuple[int, str]] = {
    "__init__.py": (1, "PEP 562 lazy export of temper.api"),
    "models/__init__.py": (1, "PEP 562 lazy export of temper.models.loader"),
    "serve/__init__.py": (1, "PEP 562 lazy exports (FastAPI only on use)"),
    "serve/limits.py": (1, "uvicorn's transport, wrapped"),
    "targets.py": (2, "the user's module, by the dotted name in config"),
    "api.py": (5, "the user's functions and dataset objects"),
    "data/datasets.py": (2, "the user's dataset object and answer extractor"),
    "rewards/trl_adapter.py": (2, "the user's reward function and its return value"),
    "rewards/base.py": (1, "a reward value: numpy and torch scalars have .item()"),
    "rewards/code_hacks.py": (3, "the standard library and ast nodes of checked code"),
    "rewards/harness/runner.py": (1, "os.O_NOFOLLOW, where the platform has it"),
    "rewards/rm_batcher.py": (1, "an HF model config"),
    "envs/gym_adapter.py": (2, "Gymnasium observations and env classes by name"),
    "envs/mcp_server.py": (9, "the MCP SDK's results, content blocks and errors"),
    "vision/images.py": (3, "PIL images passed by the user"),
    "vision/processor.py": (2, "an HF processor"),
    "sandbox/config.py": (1, "sys._base_executable"),
    "compute.py": (1, "os.sched_getaffinity, where the platform has it"),
    "weights/transport.py": (1, "a torch dtype by name"),
    "backends/ray_pool.py": (1, "Ray's actor error"),
    "engine/requests.py": (3, "an HF model and its generation config"),
    "engine/native.py": (2, "a torch dtype by name"),
    "engine/image_encoder.py": (2, "an HF model config"),
    "engine/llama_forward.py": (12, "HF model configs and modules"),
    "engine/llama_weights.py": (3, "HF model configs and rotary modules"),
    "engine/hf.py": (2, "an HF model config"),
    "engine/openai_endpoint.py": (1, "an HF tokenizer"),
    "engine/vllm_engine.py": (3, "vLLM's HF config"),
    "engine/vllm_extras.py": (5, "vLLM's HF config and the tokenizer"),
    "trainer/expert_parallel.py": (7, "HF MoE modules"),
    "trainer/critic.py": (1, "an HF model config"),
    "trainer/forward.py": (1, "an HF model output"),
    "trainer/parallel.py": (4, "HF model configs and layers"),
    "trainer/vocab_parallel.py": (2, "HF model modules"),
    "trainer/pipeline.py": (3, "HF model modules"),
}

#: House rules: a module's lines, and a function's own lines (nested functions and its
#: docstring not counted).
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 90


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. "temper.engine.native"
    target: str  # the imported module, e.g. "temper.models.loader"
    line: int


def modules() -> dict[str, Path]:
    """Every module of `temper`, by dotted name."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def part_of(module: str) -> str:
    """The top-level part a module belongs to ("temper" itself is "__init__")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> list[Import]:
    """Every import of a `temper` module, at module level or inside functions."""
    known = modules()
    out = []
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from temper import compute`: the module is temper.compute.
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                    for a in node.names
                ]
            else:
                continue
            out += [Import(name, t, node.lineno) for t in targets if t.startswith("temper")]
    return out


def upward_imports() -> list[Import]:
    """Imports from a part to a part on the same floor or above it."""
    bad = []
    for imp in imports():
        a, b = part_of(imp.module), part_of(imp.target)
        if FACE in (a, b) or a == b or (a, b) in UPWARD_ALLOWED:
            continue
        if FLOORS[b] >= FLOORS[a]:
            bad.append(imp)
    return bad


def circles() -> list[list[str]]:
    """Modules that import each other in a loop (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = defaultdict(set)
    known = modules()
    for imp in imports():
        if imp.target in known and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in list(known):
        if v not in index:
            visit(v)
    return found


def construction_sites() -> dict[str, list[str]]:
    """Where each component of `BUILT_BY_BUILDER` is constructed: ``module:line``."""
    names = {cls: part for part, classes in BUILT_BY_BUILDER.items() for cls in classes}
    sites: dict[str, list[str]] = defaultdict(list)
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Name) and called.id in names:
                sites[called.id].append(f"{name}:{node.lineno}")
    return dict(sites)


def misplaced_constructions() -> list[str]:
    """Constructions of a component outside the builder and outside its own part."""
    owner = {cls: part for part, classes in BUILT_BY_BUILDER.items() for cls in classes}
    bad = []
    for cls, places in construction_sites().items():
        for place in places:
            part = part_of(place.split(":")[0])
            if part not in ("builder", owner[cls]):
                bad.append(f"{cls} at {place}")
    return bad


def probes() -> dict[str, int]:
    """getattr/hasattr calls per file (relative to src/temper)."""
    counts: dict[str, int] = defaultdict(int)
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
            ):
                counts[str(path.relative_to(PACKAGE))] += 1
    return dict(counts)


def _own_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    nested: set[int] = set()
    for child in ast.iter_child_nodes(fn):
        for node in ast.walk(child):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                nested.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    doc = 0
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        doc = (first.end_lineno or first.lineno) - first.lineno + 1
    return (fn.end_lineno or fn.lineno) - fn.lineno + 1 - len(nested) - doc


def oversized() -> list[str]:
    """Modules and functions over the house rules."""
    out = []
    for name, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            out.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and (n := _own_lines(node)) > MAX_FUNCTION_LINES:
                out.append(f"{name}.{node.name}: {n} lines")
    return out


def main() -> None:
    print("floors (a part imports only parts on lower floors):")
    for floor in sorted(set(FLOORS.values()), reverse=True):
        print(f"  {floor:2d}  {', '.join(p for p, f in FLOORS.items() if f == floor)}")
    print(f"imports that run up or across a floor: {len(upward_imports())}")
    for imp in upward_imports():
        print(f"  {imp.module}:{imp.line} -> {imp.target}")
    print(f"import circles: {circles() or 'none'}")
    print("where components are constructed:")
    for cls, places in sorted(construction_sites().items()):
        print(f"  {cls}: {', '.join(places)}")
    print(f"constructed outside the builder and their own part: {misplaced_constructions()}")
    print("getattr/hasattr per file (all on objects Temper does not define):")
    for file, n in sorted(probes().items()):
        print(f"  {file}: {n}  ({FOREIGN_PROBES.get(file, (0, 'NOT LISTED'))[1]})")
    print(f"over {MAX_MODULE_LINES} lines a module / {MAX_FUNCTION_LINES} a function: "
          f"{oversized() or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
