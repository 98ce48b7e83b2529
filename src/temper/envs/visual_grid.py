"""VisualGrid: a multi-turn navigation env whose observations are rendered pictures.

The task holds a small grid (default 4x4) with a few walls; the model is the blue
circle and must reach the green square. Each observation is a 64x64 picture of the
grid (black cells are walls) and a sentence; each turn the model answers one move,
`\\boxed{up}` / `down` / `left` / `right` (the last boxed answer, else the last
direction word, counts). A move into a wall or off the grid leaves it in place and
says so. Reaching the goal earns `success_reward` and ends the episode; every valid
move costs `step_penalty`; a turn with no direction earns `-invalid_penalty` and an
error observation and is not counted as a move. The episode also ends after the
task's `max_moves` valid moves (success False). `info["success"]` is set on every step.

Hermetic and seeded: a task is named by a 48-bit key, and its layout is a pure
function of the key and the grid options (`make_layout`); steps are deterministic, so
the same task and the same turns replay the same pictures. Tasks are split by a
stable hash of their name (about 20% held out), as in `temper.data.visual`.
`visual_grid_spec` is the registry's spec factory (`env.type = "visual_grid"`).
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw

from temper.data.sampler import ProceduralSampler
from temper.data.visual import SIZE, is_heldout, user_content
from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards.answers import extract_boxed

MOVES: dict[str, tuple[int, int]] = {
    "up": (0, -1),
    "down": (0, 1),
    "left": (-1, 0),
    "right": (1, 0),
}
_WORD = re.compile(r"[a-z]+")
Cell = tuple[int, int]


@dataclass(frozen=True)
class Layout:
    """A grid: `size` x `size` cells, walls, the start cell and the goal (x grows right)."""

    size: int
    walls: frozenset[Cell]
    start: Cell
    goal: Cell

    def open(self, cell: Cell) -> bool:
        x, y = cell
        return 0 <= x < self.size and 0 <= y < self.size and cell not in self.walls

    def distances(self) -> dict[Cell, int]:
        """Moves from each reachable cell to the goal (breadth-first from the goal)."""
        dist, todo = {self.goal: 0}, deque([self.goal])
        while todo:
            x, y = todo.popleft()
            for dx, dy in MOVES.values():
                nxt = (x + dx, y + dy)
                if self.open(nxt) and nxt not in dist:
                    dist[nxt] = dist[(x, y)] + 1
                    todo.append(nxt)
        return dist

    def best_move(self, at: Cell) -> str:
        """A move that shortens the path to the goal (first in `MOVES` order on ties)."""
        dist = self.distances()
        options = [
            (dist[(at[0] + dx, at[1] + dy)], name)
            for name, (dx, dy) in MOVES.items()
            if (at[0] + dx, at[1] + dy) in dist
        ]
        return min(options, key=lambda o: o[0])[1]


def make_layout(key: int, size: int = 4, n_walls: int = 3) -> Layout:
    """The layout of task `key`: drawn until start and goal are apart and connected."""
    rng = random.Random(f"grid:{size}:{n_walls}:{key}")
    cells = [(x, y) for y in range(size) for x in range(size)]
    while True:
        picked = rng.sample(cells, n_walls + 2)
        layout = Layout(size, frozenset(picked[2:]), picked[0], picked[1])
        if layout.distances().get(layout.start, 0) >= 1:
            return layout


def render_grid(layout: Layout, at: Cell) -> Image.Image:
    """The picture: grey grid lines, black walls, green goal, the blue circle at `at`."""
    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    cell = SIZE // layout.size
    for i in range(1, layout.size):
        draw.line((i * cell, 0, i * cell, SIZE), fill=(200, 200, 200))
        draw.line((0, i * cell, SIZE, i * cell), fill=(200, 200, 200))
    for x, y in layout.walls:
        draw.rectangle((x * cell, y * cell, (x + 1) * cell - 1, (y + 1) * cell - 1), fill=(0, 0, 0))
    gx, gy = layout.goal
    draw.rectangle((gx * cell + 2, gy * cell + 2, (gx + 1) * cell - 3, (gy + 1) * cell - 3),
                   fill=(30, 170, 60))  # fmt: skip
    ax, ay = at
    draw.ellipse((ax * cell + 3, ay * cell + 3, (ax + 1) * cell - 4, (ay + 1) * cell - 4),
                 fill=(40, 70, 220))  # fmt: skip
    return image


def parse_move(text: str) -> str | None:
    """The last `\\boxed{...}`'s direction if there is one, else the last direction word."""
    boxed = extract_boxed(text)
    words = [w for w in _WORD.findall((boxed if boxed is not None else text).lower()) if w in MOVES]
    return words[-1] if words else None


PROMPT = (
    "You are the blue circle. Reach the green square; black cells are walls. Each turn, "
    "answer with one move: \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
)


class GridTasks:
    """Grid tasks keyed by a 48-bit key, split by a stable hash of `grid<size>-<key>`."""

    def __init__(self, size: int = 4, n_walls: int = 3, max_moves: int = 8) -> None:
        if size < 2 or not 0 <= n_walls <= size * size - 2:
            raise ValueError("visual_grid needs size >= 2 and 0 <= walls <= size*size-2")
        if max_moves < 1:
            raise ValueError("visual_grid needs max_moves >= 1")
        self.size, self.n_walls, self.max_moves = size, n_walls, max_moves

    def _heldout(self, key: int) -> bool:
        return is_heldout(f"grid{self.size}", key)

    def task(self, key: int) -> Task:
        """The task with this key (from either split): the first picture and the prompt."""
        layout = make_layout(key, self.size, self.n_walls)
        content = user_content(render_grid(layout, layout.start), PROMPT)
        columns = {"key": key, "size": self.size, "walls": self.n_walls,
                   "max_moves": self.max_moves, "shortest": layout.distances()[layout.start]}  # fmt: skip
        return Task(f"grid{self.size}-{key}", [{"role": "user", "content": content}], None,
                    "grid", columns)  # fmt: skip

    def sample(self, rng: random.Random, k: int = 1) -> list[Task]:
        """k training-split tasks drawn from `rng`."""
        out: list[Task] = []
        while len(out) < k:
            key = rng.getrandbits(48)
            if not self._heldout(key):
                out.append(self.task(key))
        return out

    def heldout(self, n: int = 50, seed: int = 1234) -> list[Task]:
        """The same n held-out tasks every time."""
        rng, out = random.Random(seed), []
        while len(out) < n:
            key = rng.getrandbits(48)
            if self._heldout(key):
                out.append(self.task(key))
        return out


class VisualGridEnv:
    """Plays one grid episode per `reset`; see the module docstring for the rules."""

    def __init__(
        self,
        success_reward: float = 1.0,
        step_penalty: float = 0.0,
        invalid_penalty: float = 0.1,
        system_prompt: str | None = None,
    ) -> None:
        self.success_reward, self.step_penalty = success_reward, step_penalty
        self.invalid_penalty, self.system_prompt = invalid_penalty, system_prompt
        self.layout: Layout | None = None
        self.at: Cell = (0, 0)
        self.moves = self.left = 0

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        """Start on `task` (columns key, size, walls, max_moves); the seed is unused."""
        c = task.columns
        self.layout = make_layout(int(c["key"]), int(c["size"]), int(c["walls"]))
        self.at, self.moves, self.left = self.layout.start, 0, int(c["max_moves"])
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, *task.messages()]

    def picture(self) -> Image.Image:
        """The current picture (what the last observation showed)."""
        if self.layout is None:
            raise RuntimeError("VisualGridEnv has no episode: call reset first")
        return render_grid(self.layout, self.at)

    async def step(self, turn: AssistantTurn) -> StepResult:
        """Apply one move and answer with the new picture."""
        if self.layout is None or self.left <= 0:
            raise RuntimeError("VisualGridEnv.step called before reset or after the end")
        move = parse_move(turn.text)
        if move is None:
            info = {"success": False, "moves": self.moves, "position": list(self.at)}
            text = "error: no move found; answer with \\boxed{up}, down, left or right"
            msg = {"role": "user", "content": text}
            return StepResult([msg], -self.invalid_penalty, False, info, {"invalid_turns": 1.0})
        dx, dy = MOVES[move]
        target = (self.at[0] + dx, self.at[1] + dy)
        blocked = not self.layout.open(target)
        if not blocked:
            self.at = target
        self.moves, self.left = self.moves + 1, self.left - 1
        success = self.at == self.layout.goal
        done = success or self.left <= 0
        note = f"Blocked: you cannot move {move}." if blocked else f"You moved {move}."
        note += " You reached the green square!" if success else f" {self.left} moves left."
        reward = -self.step_penalty + (self.success_reward if success else 0.0)
        info = {"success": success, "moves": self.moves, "position": list(self.at)}
        msg = {"role": "user", "content": user_content(self.picture(), note)}
        return StepResult([msg], reward, done, info, {"moves": 1.0, "blocked": float(blocked)})

    async def close(self) -> None:
        self.left = 0


_OPTIONS: dict[str, Any] = {
    "size": 4, "walls": 3, "max_moves": 8, "success_reward": 1.0, "step_penalty": 0.0,
    "invalid_penalty": 0.1, "system_prompt": None, "eval_size": 50,
}  # fmt: skip


def visual_grid_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for `env.type = "visual_grid"`.

    Options (defaults): size (4 cells a side), walls (3), max_moves (8),
    success_reward (1.0), step_penalty (0.0), invalid_penalty (0.1),
    system_prompt (None), eval_size (50).
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigError(
            f"env.options.{unknown[0]}: unknown option for env 'visual_grid'; "
            f"allowed: {', '.join(sorted(_OPTIONS))}"
        )
    o = {**_OPTIONS, **options}
    for key in ("size", "walls", "max_moves", "eval_size"):
        if not isinstance(o[key], int) or isinstance(o[key], bool) or o[key] < 0:
            raise ConfigError(f"env.options.{key} must be a non-negative integer, got {o[key]!r}")
    try:
        gen = GridTasks(o["size"], o["walls"], o["max_moves"])
    except ValueError as exc:
        raise ConfigError(f"env.options: {exc}") from None
    keys = ("success_reward", "step_penalty", "invalid_penalty", "system_prompt")
    return EnvSpec(
        make_env=lambda task: VisualGridEnv(**{k: o[k] for k in keys}),
        train=ProceduralSampler(gen, seed),
        heldout=gen.heldout(o["eval_size"]),
        name="visual_grid",
    )
