"""The Gymnasium adapter on our TextMaze (text and discrete actions) and on small
gymnasium envs written here: observations, rewards, success, bad actions, replay, specs."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from temper.builder.tasks import build_env_spec
from temper.envs import AssistantTurn, StepResult
from temper.envs.gym_adapter import GymEnv, GymSeedTasks, is_heldout_seed, make_gym
from temper.envs.text_gym import ACTIONS, TextMaze
from temper.errors import ConfigError
from temper.records import Task

MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def shortest_path(maze: TextMaze) -> list[str]:
    """Moves from the agent to the exit (BFS over open cells)."""
    start, todo, back = maze.pos, deque([maze.pos]), {maze.pos: None}
    while todo:
        cell = todo.popleft()
        if cell == maze.exit:
            break
        for name, (dx, dy) in MOVES.items():
            nxt = (cell[0] + dx, cell[1] + dy)
            if maze._open(nxt) and nxt not in back:
                back[nxt] = (cell, name)
                todo.append(nxt)
    path, cell = [], maze.exit
    while cell != start:
        cell, name = back[cell]  # type: ignore[misc]
        path.append(name)
    return path[::-1]


def step(env: GymEnv, text: str) -> StepResult:
    return run(env.step(AssistantTurn(text, [])))


def maze_env(discrete: bool = False, **kwargs: Any) -> GymEnv:
    return GymEnv(lambda: TextMaze(discrete=discrete, **kwargs), instructions="Find the exit.")


# ----------------------------------------------------------------------------- TextMaze


def test_text_maze_is_seeded_solvable_and_registered() -> None:
    maze = TextMaze()
    layouts = set()
    for seed in range(20):
        first, info = maze.reset(seed=seed)
        again, _ = maze.reset(seed=seed)
        assert first == again and info["success"] is False
        assert maze.observation_space.contains(first)
        layouts.add(first)
        moves = shortest_path(maze)
        for i, move in enumerate(moves):
            obs, reward, terminated, truncated, info = maze.step(f"go {move}")
            assert terminated == (i == len(moves) - 1) and not truncated
        assert reward == 1.0 and info["success"] and "You reached the exit!" in obs
    assert len(layouts) > 15
    made = gymnasium.make("temper/TextMazeDiscrete-v0")
    assert isinstance(made.unwrapped, TextMaze) and made.action_space == spaces.Discrete(4)
    made.close()


def test_text_maze_walls_unknown_commands_and_truncation() -> None:
    maze = TextMaze(width=3, height=1, wall_fraction=0.0, max_steps=2)
    obs, _ = maze.reset(seed=0)
    blocked = [a for a in ACTIONS if a not in maze.open_moves()]
    assert "up" in blocked and "down" in blocked  # a one-row maze
    pos = maze.pos
    obs, reward, terminated, truncated, info = maze.step("UP!")
    assert maze.pos == pos and "You cannot move up: blocked." in obs and reward == 0.0
    assert not terminated and not truncated and info["invalid_command"] is False
    obs, reward, terminated, truncated, info = maze.step("jump")
    assert obs.startswith("Unknown command 'jump'") and info["invalid_command"] is True
    assert truncated and not terminated  # max_steps=2 reached without the exit


# ----------------------------------------------------------------------------- adapter, text


def test_adapter_plays_text_maze_to_success() -> None:
    env = maze_env()
    first = run(env.reset(Task("t", "", columns={"seed": 4}), seed=None))
    assert first[0] == {"role": "system", "content": "Find the exit."}
    assert first[1]["role"] == "user" and "Open moves:" in first[1]["content"]
    maze = env.gym_env.unwrapped
    moves = shortest_path(maze)
    results = [step(env, f"I go \\boxed{{{m}}}" if i % 2 else m) for i, m in enumerate(moves)]
    assert [r.done for r in results] == [False] * (len(moves) - 1) + [True]
    last = results[-1]
    assert last.reward == 1.0 and last.info["success"] is True and last.info["terminated"]
    assert (
        last.observation[0]["role"] == "user"
        and "reached the exit" in last.observation[0]["content"]
    )
    assert all(r.metrics == {"gym_steps": 1.0} for r in results)
    assert all(r.info["success"] is False for r in results[:-1])


def test_adapter_rejects_text_outside_the_space() -> None:
    env = maze_env()
    run(env.reset(Task("t", "", columns={"seed": 1})))
    maze = env.gym_env.unwrapped
    pos, steps = maze.pos, maze.steps
    for bad in ["", "  \n ", "left\nright", "x" * 65, "go <left>"]:
        result = step(env, bad)
        assert result.observation[0]["content"].startswith("error: action must be 1..64 characters")
        assert result.reward == -0.1 and not result.done
        assert result.metrics == {"invalid_actions": 1.0} and result.info["invalid_action"]
    assert (maze.pos, maze.steps) == (pos, steps)  # the gym env never saw them
    # Text inside the space but meaningless is the gym env's business, not an adapter error.
    result = step(env, "jump")
    assert result.info["invalid_command"] is True and result.info["invalid_action"] is False
    assert result.reward == 0.0 and result.metrics == {"gym_steps": 1.0}


# ----------------------------------------------------------------------------- adapter, discrete


def test_adapter_parses_discrete_actions() -> None:
    env = GymEnv(lambda: TextMaze(discrete=True), action_names=ACTIONS, invalid_penalty=0.25)
    first = run(env.reset(Task("t", "", columns={"seed": 2})))
    assert [m["role"] for m in first] == ["user"]  # no instructions: no system message
    assert env.parse_action("\\boxed{2}") == (2, None)
    assert env.parse_action("first 0 then 3") == (3, None)
    assert env.parse_action("Left") == (0, None) and env.parse_action("\\boxed{down}") == (3, None)
    for bad, message in [
        ("7", "action 7 is out of range [0, 3] or one of: left, right, up, down"),
        ("-1", "action -1 is out of range [0, 3]"),
        ("go west", "no action found; answer with an integer in [0, 3]"),
        ("9" * 5000, "is out of range [0, 3]"),
    ]:
        result = step(env, bad)
        assert message in result.observation[0]["content"] and result.reward == -0.25
        assert not result.done and result.metrics == {"invalid_actions": 1.0}
    maze = env.gym_env.unwrapped
    for i, move in enumerate(shortest_path(maze)):
        result = step(env, str(ACTIONS.index(move)) if i % 2 else move)
    assert result.done and result.info["success"] is True and result.reward == 1.0


class Countdown(gymnasium.Env):
    """Reach 0 from `start` by typing how much to subtract (Discrete(3, start=1));
    overshooting terminates with reward 0. No "success" in info: the adapter's rule
    applies. Info carries numpy values."""

    def __init__(self, start: int = 4, limit: int = 10) -> None:
        self.action_space = spaces.Discrete(3, start=1)
        self.observation_space = spaces.Text(100)
        self.start, self.limit = start, limit

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.left, self.steps = (options or {}).get("start", self.start), 0
        return f"left {self.left}", {}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        self.left -= int(action)
        self.steps += 1
        terminated = self.left <= 0
        reward = 1.0 if self.left == 0 else 0.0
        info = {"left": np.int64(self.left), "trace": np.array([self.left, self.steps])}
        return f"left {self.left}", reward, terminated, self.steps >= self.limit, info


def test_success_rule_options_and_numpy_info() -> None:
    env = GymEnv(lambda: Countdown())
    first = run(env.reset(Task("t", "", columns={"options": {"start": 5}})))
    assert first == [{"role": "user", "content": "left 5"}]
    assert "[1, 3]" in step(env, "0").observation[0]["content"]  # start=1 shifts the range
    r = step(env, "3")
    assert r.info == {
        "left": 2, "trace": [2, 1], "success": False, "terminated": False,
        "truncated": False, "invalid_action": False,
    }  # fmt: skip
    assert type(r.info["left"]) is int
    r = step(env, "2")
    assert r.done and r.reward == 1.0 and r.info["success"] is True  # terminated, reward > 0
    run(env.reset(Task("t", "")))
    step(env, "3")
    r = step(env, "3")
    assert r.done and r.reward == 0.0 and r.info["success"] is False  # overshoot: reward 0
    env = GymEnv(lambda: Countdown(start=100, limit=1))
    run(env.reset(Task("t", "")))
    r = step(env, "1")
    assert r.done and r.info["truncated"] and r.info["success"] is False
    run(env.reset(Task("t", "", columns={"options": {"start": 1}})))
    r = step(env, "1")  # reaches 0 on the step that also hits the limit: terminated wins
    assert r.info["terminated"] and r.info["truncated"] and r.info["success"] is True


def test_adapter_needs_text_or_discrete_actions() -> None:
    class Boxy(Countdown):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = spaces.Box(0, 1, (2,))

    with pytest.raises(TypeError, match="Text or Discrete action space, got Box"):
        GymEnv(Boxy)
    with pytest.raises(ValueError, match="action_names needs a Discrete space with 2 actions"):
        GymEnv(lambda: TextMaze(discrete=True), action_names=["a", "b"])
    with pytest.raises(RuntimeError, match="before reset"):
        step(GymEnv(TextMaze), "left")


# ----------------------------------------------------------------------------- replay, tasks, spec


def test_replay_uses_the_task_seed() -> None:
    """Same task + same turns = same episode, whatever the episode seed; the task seed
    (not the episode seed) picks the layout, so a group shares its start state."""

    def transcript(task: Task, seed: int | None) -> list[Any]:
        env = maze_env()
        out: list[Any] = [run(env.reset(task, seed))]
        for text in ["left", "", "up", "right", "down", "down", "left"]:
            r = step(env, text)
            out.append((r.observation, r.reward, r.done, r.info, r.metrics))
            if r.done:
                break
        return out

    task = Task("t", "", columns={"seed": 12})
    assert transcript(task, 1) == transcript(task, 2) == transcript(task, None)
    assert transcript(Task("t", "", columns={"seed": 13}), 1)[0] != transcript(task, 1)[0]
    # A task without a seed column falls back to the episode seed.
    bare = Task("t", "")
    assert transcript(bare, 5) == transcript(bare, 5) and transcript(bare, 5) != transcript(bare, 6)


def test_seed_tasks_split_and_pool() -> None:
    gen = GymSeedTasks("maze", num_tasks=6)
    assert gen.pool is not None and len(gen.pool) == 6
    assert not any(is_heldout_seed(s) for s in gen.pool)
    drawn = {t.columns["seed"] for t in gen.sample(random.Random(0), 200)}
    assert drawn == set(gen.pool)
    held = gen.heldout(30)
    assert [t.columns["seed"] for t in held] == [t.columns["seed"] for t in gen.heldout(30)]
    assert all(is_heldout_seed(t.columns["seed"]) for t in held)
    free = GymSeedTasks("maze").sample(random.Random(1), 500)
    assert not {t.columns["seed"] for t in free} & {t.columns["seed"] for t in gen.heldout(10_000)}


def test_spec_builds_envs_and_tasks() -> None:
    spec = build_env_spec(
        "gym",
        {
            "env": "temper/TextMazeDiscrete-v0",
            "kwargs": {"max_steps": 7},
            "instructions": "Answer with a direction.",
            "action_names": list(ACTIONS),
            "num_tasks": 4,
            "eval_size": 3,
            "reset_options": {"unused": 1},
        },
        seed=0,
    )
    assert spec.name == "gym:temper/TextMazeDiscrete-v0" and len(spec.heldout) == 3
    task = spec.train.sample(1)[0]
    assert task.columns == {"seed": task.columns["seed"], "options": {"unused": 1}}
    env = spec.make_env(task)
    first = run(env.reset(task, 0))
    assert first[0]["content"] == "Answer with a direction." and "Open moves" in first[1]["content"]
    assert env.gym_env.unwrapped.max_steps == 7
    assert step(env, "left").info["invalid_action"] is False
    run(env.close())
    by_class = build_env_spec(
        "gym", {"env": "temper.envs.text_gym:TextMaze", "kwargs": {"width": 3}}, seed=0
    )
    env = by_class.make_env(by_class.heldout[0])
    run(env.reset(by_class.heldout[0]))
    assert isinstance(env.gym_env, TextMaze) and env.gym_env.width == 3


@pytest.mark.parametrize(
    "options,match",
    [
        ({"env": "temper/TextMaze-v0", "kwrags": {}}, r"env\.options\.kwrags: unknown option"),
        ({}, r"env\.options\.env is required"),
        ({"env": "temper/NoSuchEnv-v0"}, r"cannot make gymnasium env 'temper/NoSuchEnv-v0'"),
        ({"env": "temper.envs.text_gym:Nope"}, r"cannot load 'temper.envs.text_gym:Nope'"),
        ({"env": "temper/TextMaze-v0", "kwargs": [1]}, r"env\.options\.kwargs must be"),
        ({"env": "temper/TextMaze-v0", "eval_size": 0}, r"eval_size must be an integer >= 1"),
        (
            {"env": "temper/TextMaze-v0", "invalid_penalty": "x"},
            r"invalid_penalty must be a number",
        ),
        (
            {"env": "temper/TextMaze-v0", "action_names": ["a"]},
            r"cannot be adapted: action_names needs a Discrete space",
        ),
        ({"env": "temper/TextMaze-v0", "kwargs": {"size": 3}}, r"cannot be adapted: .*size"),
    ],
)
def test_spec_option_errors(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build_env_spec("gym", options, 0)
    assert "\n" not in str(err.value)


def test_make_gym_accepts_a_class_or_an_id() -> None:
    env = make_gym("temper.envs.text_gym:TextMaze", {"discrete": True})
    assert isinstance(env, TextMaze) and env.discrete
    env = make_gym("temper/TextMaze-v0", {})
    assert isinstance(env.unwrapped, TextMaze) and not env.unwrapped.discrete
