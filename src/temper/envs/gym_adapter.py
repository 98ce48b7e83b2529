"""Gymnasium adapter: play a text `gymnasium.Env` as a multi-turn chat `Env`.

`GymEnv` wraps a gymnasium env whose observations are text (anything else is
shown as `str(obs)`, or through `render_observation`) and whose action space
is `Text` or `Discrete`:

- `Text`: the action is the model's turn, stripped (or the content of its last
  `\\boxed{...}`, if any). Text outside the space (empty, too long, a
  character outside its charset) is not sent to the gym env.
- `Discrete(n, start)`: the action is the last `\\boxed{...}` or, failing
  that, the last integer in the turn; with `action_names`, a turn (or its
  boxed content) that is exactly a name, case-insensitive, picks that action.
  An unparseable or out-of-range action is not sent to the gym env.

A rejected action gets an `error: ...` user message (the gym env's state does
not change), reward `-invalid_penalty`, `done=False`, and counts in the
metrics `invalid_actions`. Otherwise the gym observation is the user message,
the gym reward the turn's reward, `done = terminated or truncated`, and the
gym info is merged into the step's info (numpy scalars as Python numbers)
with `terminated`, `truncated` and `success`: the gym info's own `success`
when it has one, else "terminated with a positive final reward" (the
convention of sparse goal envs such as FrozenLake; a truncated episode that
did not terminate is never a success).

`reset(task, seed)` seeds the gym env with `task.columns["seed"]` when the
task has one, else with the episode seed. Using the task's seed on purpose:
every episode of a GRPO group then starts from the same state, so the group
compares policies, not layouts. Steps run on the event loop thread (gym envs
are synchronous); a slow gym env delays other episodes.

`spec(options, seed)` is the registry's spec factory for `env.type = "gym"`.
"""

from __future__ import annotations

import hashlib
import importlib
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
from gymnasium import spaces

from temper.data.sampler import ProceduralSampler
from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards.answers import extract_boxed

#: Share of all seeds in the held-out split, in percent.
HELDOUT_PERCENT = 20
_SALT = "temper-gym-seed-v1:"
_INT = re.compile(r"-?\d+")


def is_heldout_seed(seed: int) -> bool:
    """True if task seed `seed` is in the held-out split (stable across machines)."""
    digest = hashlib.sha256(f"{_SALT}{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists; the rest unchanged."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    return value


class GymEnv:
    """A chat `Env` over one gymnasium env made by `env_factory()`; see the module docstring.

    `instructions`, if given, is the system message of every episode.
    `action_names` (Discrete only) lets the model type a name instead of a
    number. Does not enforce turn limits: the rollout loop does.
    """

    def __init__(
        self,
        env_factory: Callable[[], gymnasium.Env],
        instructions: str | None = None,
        invalid_penalty: float = 0.1,
        action_names: Sequence[str] | None = None,
        render_observation: Callable[[Any], str] | None = None,
    ) -> None:
        self.gym_env = env_factory()
        space = self.gym_env.action_space
        problem: Exception | None = None
        if not isinstance(space, spaces.Text | spaces.Discrete):
            problem = TypeError(
                f"GymEnv needs a Text or Discrete action space, got {type(space).__name__}"
            )
        elif action_names is not None and (
            not isinstance(space, spaces.Discrete) or len(action_names) != int(space.n)
        ):
            problem = ValueError(
                f"action_names needs a Discrete space with {len(action_names)} actions, got {space}"
            )
        if problem is not None:
            self.gym_env.close()
            raise problem
        self.instructions = instructions
        self.invalid_penalty = invalid_penalty
        self.action_names = [a.lower() for a in action_names] if action_names else None
        self.render_observation = render_observation or (
            lambda obs: obs if isinstance(obs, str) else str(obs)
        )
        self._started = False

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        """Reset the gym env (seed: the task's `seed` column, else `seed`); return the first
        observation, after the `instructions` system message if there is one."""
        gym_seed = task.columns.get("seed", seed)
        obs, _ = self.gym_env.reset(
            seed=None if gym_seed is None else int(gym_seed), options=task.columns.get("options")
        )
        self._started = True
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return [*system, {"role": "user", "content": self.render_observation(obs)}]

    def parse_action(self, text: str) -> tuple[Any, str | None]:
        """(action, None) for a valid action, else (None, the error message for the model)."""
        boxed = extract_boxed(text)
        candidate = (boxed if boxed is not None else text).strip()
        space = self.gym_env.action_space
        if isinstance(space, spaces.Text):
            if space.contains(candidate):
                return candidate, None
            return None, (
                f"action must be {space.min_length}..{space.max_length} characters from "
                f"{''.join(sorted(set(space.character_set)))!r}"
            )
        assert isinstance(space, spaces.Discrete)
        start, n = int(space.start), int(space.n)
        if self.action_names and candidate.lower() in self.action_names:
            return start + self.action_names.index(candidate.lower()), None
        found = _INT.findall(candidate)
        names = f" or one of: {', '.join(self.action_names)}" if self.action_names else ""
        if not found:
            return (
                None,
                f"no action found; answer with an integer in [{start}, {start + n - 1}]{names}",
            )
        action = int(found[-1]) if len(found[-1]) <= 40 else None  # int() caps at 4300 digits
        if action is None or not start <= action < start + n:
            return (
                None,
                f"action {found[-1][:40]} is out of range [{start}, {start + n - 1}]{names}",
            )
        return action, None

    async def step(self, turn: AssistantTurn) -> StepResult:
        """Feed the turn's action to the gym env, or answer with an error; see the module."""
        if not self._started:
            raise RuntimeError("GymEnv.step called before reset")
        action, error = self.parse_action(turn.text)
        if error is not None:
            return StepResult(
                [{"role": "user", "content": f"error: {error}"}],
                -self.invalid_penalty,
                False,
                {"success": False, "invalid_action": True},
                {"invalid_actions": 1.0},
            )
        obs, reward, terminated, truncated, gym_info = self.gym_env.step(action)
        reward = float(reward)
        info = {str(k): _plain(v) for k, v in gym_info.items()}
        if "success" in info:
            info["success"] = bool(info["success"])
        else:
            info["success"] = bool(terminated) and reward > 0
        info.update(terminated=bool(terminated), truncated=bool(truncated), invalid_action=False)
        done = bool(terminated or truncated)
        message = {"role": "user", "content": self.render_observation(obs)}
        return StepResult([message], reward, done, info, {"gym_steps": 1.0})

    async def close(self) -> None:
        self.gym_env.close()


# ----------------------------------------------------------------------------- spec


class GymSeedTasks:
    """Tasks that are gym seeds (`Task.columns["seed"]`), split by a hash of the seed.

    With `num_tasks`, training draws from the first `num_tasks` training-split
    seeds (0, 1, 2, ... skipping held-out ones); without, from all of
    `[0, 2**31)`. `heldout(n)` is the first n held-out seeds, always the same.
    """

    def __init__(
        self, name: str, num_tasks: int | None = None, reset_options: dict[str, Any] | None = None
    ) -> None:
        self.name, self.reset_options = name, reset_options
        self.pool = self._first(num_tasks, held=False) if num_tasks else None

    @staticmethod
    def _first(n: int, held: bool) -> list[int]:
        out, s = [], 0
        while len(out) < n:
            if is_heldout_seed(s) == held:
                out.append(s)
            s += 1
        return out

    def task(self, seed: int) -> Task:
        """The task for gym seed `seed` (from either split)."""
        columns: dict[str, Any] = {"seed": seed}
        if self.reset_options is not None:
            columns["options"] = dict(self.reset_options)
        # The prompt is a label only: the first observation comes from the gym env.
        return Task(f"gym-{self.name}-{seed}", f"{self.name} (seed {seed})", None, "gym", columns)

    def sample(self, rng: random.Random, k: int = 1) -> list[Task]:
        """k training-split tasks drawn from `rng`."""
        out: list[Task] = []
        while len(out) < k:
            s = rng.choice(self.pool) if self.pool else rng.randrange(2**31)
            if not is_heldout_seed(s):
                out.append(self.task(s))
        return out

    def heldout(self, n: int = 100) -> list[Task]:
        """The first n held-out seeds as tasks."""
        return [self.task(s) for s in self._first(n, held=True)]


def make_gym(env: str, kwargs: dict[str, Any]) -> gymnasium.Env:
    """A gymnasium env from `"module:Class"` (called with kwargs) or a registered id.

    Our own ids (`temper/TextMaze-v0`, ...) are registered on import here.
    Raises `ConfigError` when the target cannot be found.
    """
    import temper.envs.text_gym  # noqa: F401  (registers the built-in text envs)

    module_name, sep, attr = env.rpartition(":")
    if sep and module_name and attr.isidentifier():
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"env.options.env: cannot load {env!r}: {exc}") from exc
        return target(**kwargs)
    try:
        return gymnasium.make(env, **kwargs)
    except gymnasium.error.Error as exc:
        raise ConfigError(f"env.options.env: cannot make gymnasium env {env!r}: {exc}") from exc


_OPTIONS = {
    "env", "kwargs", "instructions", "num_tasks", "eval_size", "invalid_penalty",
    "action_names", "reset_options",
}  # fmt: skip


def spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for `env.type = "gym"`.

    Options: `env` (required: "module:Class" or a gymnasium id), `kwargs`
    (dict for the constructor / `gymnasium.make`), `instructions` (system
    message), `num_tasks` (training seed pool size; None = unbounded),
    `eval_size` (held-out seeds, default 100), `invalid_penalty` (0.1),
    `action_names` (Discrete only), `reset_options` (passed to `reset`).
    """
    for key in options:
        if key not in _OPTIONS:
            raise ConfigError(
                f"env.options.{key}: unknown option for env 'gym'; allowed: {', '.join(sorted(_OPTIONS))}"
            )
    name = options.get("env")
    if not isinstance(name, str) or not name:
        raise ConfigError('env.options.env is required: "module:Class" or a gymnasium env id')
    kwargs = options.get("kwargs") or {}
    reset_options = options.get("reset_options")
    for key, value in (("kwargs", kwargs), ("reset_options", reset_options or {})):
        if not isinstance(value, dict):
            raise ConfigError(f"env.options.{key} must be a table/dict, got {value!r}")
    instructions = options.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ConfigError(f"env.options.instructions must be a string, got {instructions!r}")
    sizes = {}
    for key, default in (("num_tasks", None), ("eval_size", 100)):
        value = options.get(key, default)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"env.options.{key} must be an integer >= 1, got {value!r}")
        sizes[key] = value
    penalty = options.get("invalid_penalty", 0.1)
    if isinstance(penalty, bool) or not isinstance(penalty, int | float):
        raise ConfigError(f"env.options.invalid_penalty must be a number, got {penalty!r}")
    names = options.get("action_names")
    if names is not None and (
        not isinstance(names, list) or not all(isinstance(n, str) for n in names)
    ):
        raise ConfigError(f"env.options.action_names must be a list of strings, got {names!r}")

    def make_env(task: Task) -> GymEnv:
        return GymEnv(lambda: make_gym(name, kwargs), instructions, float(penalty), names)

    # Build one env now so a bad target or action space fails at startup, not per episode.
    try:
        probe = make_env(Task("probe", ""))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env.options: env {name!r} cannot be adapted: {exc}") from exc
    probe.gym_env.close()
    gen = GymSeedTasks(name, sizes["num_tasks"], reset_options)
    return EnvSpec(
        make_env=make_env,
        train=ProceduralSampler(gen, seed),
        heldout=gen.heldout(sizes["eval_size"]),
        name=f"gym:{name}",
    )
