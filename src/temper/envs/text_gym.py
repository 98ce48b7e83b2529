"""TextMaze: a small gymnasium env with text observations, for the Gym adapter.

The agent stands in a `width` x `height` grid with a few walls and must reach
the exit. Each step it moves `left`, `right`, `up` or `down`; the observation
is a text map (`#` wall, `.` floor, `A` agent, `E` exit) plus a sentence that
says where it is and which moves are open. Reaching the exit gives reward 1
and terminates; every other step gives `-step_penalty`; after `max_steps`
steps the episode is truncated. `info["success"]` says whether the exit was
reached.

Two action spaces: `TextMaze()` takes text (`gymnasium.spaces.Text`; the last
direction word in it counts, so "go left" works; text without one is an
unknown command: the agent stays put and `info["invalid_command"]` is True);
`TextMaze(discrete=True)` takes `Discrete(4)` (0 left, 1 right, 2 up, 3 down).

The layout depends only on the reset seed (drawn from `self.np_random`, which
`reset(seed=...)` reseeds) and steps are deterministic, so a seed and a list of
actions always replay the same episode. Importing this module registers
`temper/TextMaze-v0` and `temper/TextMazeDiscrete-v0` with gymnasium.

This is a test bed, not a benchmark: mazes are small and always solvable.
"""

from __future__ import annotations

import string
from collections import deque
from typing import Any

import gymnasium
from gymnasium import spaces

#: Action names in Discrete order, and their (dx, dy); y grows downwards.
ACTIONS: tuple[str, ...] = ("left", "right", "up", "down")
_MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
#: Characters a text action may use (what a short typed command needs).
ACTION_CHARSET = string.ascii_letters + string.digits + " .,!?'-_:"


class TextMaze(gymnasium.Env[str, Any]):
    """A grid maze seen and played through text; see the module docstring."""

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}  # noqa: RUF012 (gymnasium's API)

    def __init__(
        self,
        width: int = 5,
        height: int = 5,
        wall_fraction: float = 0.2,
        max_steps: int = 20,
        step_penalty: float = 0.0,
        discrete: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if width < 2 or height < 1 or not 0 <= wall_fraction < 0.5 or max_steps < 1:
            raise ValueError(
                "TextMaze needs width >= 2, height >= 1, 0 <= wall_fraction < 0.5, max_steps >= 1"
            )
        self.width, self.height = width, height
        self.wall_fraction, self.max_steps = wall_fraction, max_steps
        self.step_penalty, self.discrete = step_penalty, discrete
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=4096, charset=string.printable)
        self.action_space: spaces.Space[Any] = (
            spaces.Discrete(4) if discrete else spaces.Text(64, charset=ACTION_CHARSET)
        )
        self.walls: set[tuple[int, int]] = set()
        self.pos = self.exit = (0, 0)
        self.steps = 0

    # -- layout

    def _reachable(self, start: tuple[int, int]) -> set[tuple[int, int]]:
        seen, todo = {start}, deque([start])
        while todo:
            x, y = todo.popleft()
            for dx, dy in _MOVES.values():
                nxt = (x + dx, y + dy)
                if self._open(nxt) and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def _open(self, cell: tuple[int, int]) -> bool:
        x, y = cell
        return 0 <= x < self.width and 0 <= y < self.height and cell not in self.walls

    def _layout(self) -> None:
        """Draw start, exit and walls from `np_random` until the exit is reachable."""
        cells = [(x, y) for y in range(self.height) for x in range(self.width)]
        while True:
            order = self.np_random.permutation(len(cells))
            self.pos, self.exit = cells[order[0]], cells[order[1]]
            n_walls = int(self.wall_fraction * len(cells))
            self.walls = {cells[i] for i in order[2 : 2 + n_walls]}
            if self.exit in self._reachable(self.pos):
                return

    # -- text

    def open_moves(self) -> list[str]:
        """The moves that do not bump into a wall or the edge, in `ACTIONS` order."""
        x, y = self.pos
        return [a for a in ACTIONS if self._open((x + _MOVES[a][0], y + _MOVES[a][1]))]

    def describe(self, note: str = "") -> str:
        """The observation: the map, the position and the open moves."""
        rows = []
        for y in range(self.height):
            row = ""
            for x in range(self.width):
                cell = (x, y)
                row += (
                    "A" if cell == self.pos
                    else "E" if cell == self.exit
                    else "#" if cell in self.walls
                    else "."
                )  # fmt: skip
            rows.append(row)
        where = (
            f"You are at A {self.pos}, the exit E is at {self.exit} (x grows right, y grows down). "
            f"Open moves: {', '.join(self.open_moves()) or 'none'}."
        )
        return "\n".join([*([note] if note else []), *rows, where])

    def render(self) -> str | None:
        return self.describe() if self.render_mode == "ansi" else None

    # -- gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """New layout from `seed`; `options` is accepted and ignored."""
        super().reset(seed=seed)
        self._layout()
        self.steps = 0
        return self.describe(), {"success": False, "position": list(self.pos)}

    def _direction(self, action: Any) -> str | None:
        if self.discrete:
            return ACTIONS[int(action)]
        words = [w.strip(".,!?'-_:").lower() for w in str(action).split()]
        named = [w for w in words if w in _MOVES]
        return named[-1] if named else None

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Move one cell (walls and edges block); reward 1 on reaching the exit."""
        self.steps += 1
        direction = self._direction(action)
        if direction is None:
            note = f"Unknown command {str(action)[:32]!r}; type one of: {', '.join(ACTIONS)}."
        else:
            dx, dy = _MOVES[direction]
            nxt = (self.pos[0] + dx, self.pos[1] + dy)
            if self._open(nxt):
                self.pos, note = nxt, f"You move {direction}."
            else:
                note = f"You cannot move {direction}: blocked."
        success = self.pos == self.exit
        reward = 1.0 if success else 0.0 - self.step_penalty
        truncated = not success and self.steps >= self.max_steps
        if success:
            note += " You reached the exit!"
        info = {
            "success": success,
            "position": list(self.pos),
            "invalid_command": direction is None,
        }
        return self.describe(note), reward, success, truncated, info


gymnasium.register("temper/TextMaze-v0", entry_point=TextMaze)
gymnasium.register("temper/TextMazeDiscrete-v0", entry_point=TextMaze, kwargs={"discrete": True})
