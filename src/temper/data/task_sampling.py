"""Task samplers that learn from results: difficulty-targeted, curriculum, user-weighted.

A sampler here chooses *arms* and draws a task from each chosen arm:

- `TaskArms`: a finite task list, one arm per task id (``stats_by = "task"``).
- `CategoryArms`: one arm per category. Over a finite list, each category is
  walked in its own shuffled epochs; over a procedural generator (arithmetic
  levels, visual kinds: an endless stream in which a task rarely repeats) the
  generator draws a fresh task of that category.

The policies that choose arms (`sampler.type`):

- ``targeted``: Thompson sampling towards a pass rate. Each arm's pass rate
  has a Beta posterior (`TaskStats`); a draw from it is scored by its distance
  to ``target`` and the closest arms win. Uncertain arms (rarely seen, or
  stale under ``decay``) draw widely, so they are explored; arms that are
  surely solved or surely failed are left alone.
- ``curriculum``: category weights interpolated over training steps.
- ``weighted``: a user function maps the arms' statistics to weights.

The uniform sampler is `temper.data.sampler` (`ListSampler`,
`ProceduralSampler`), unchanged. `AdaptiveSampler.observe` is fed every
scored trajectory of a step (also those of zero-variance groups, which the
trainer drops: they tell the most about difficulty). Its whole state (RNG,
statistics, positions, the step) is in `state_dict`, so a resumed run draws
exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from temper.data.task_stats import TaskStats
from temper.errors import TemperError
from temper.records import Task, Trajectory

if TYPE_CHECKING:
    from temper.config.sampler import CurriculumPoint


@runtime_checkable
class CategorisedGenerator(Protocol):
    """A procedural generator that can draw a task of a given category."""

    @property
    def categories(self) -> tuple[str, ...]: ...
    def sample_in(self, rng: random.Random, category: str) -> Task: ...


@runtime_checkable
class LearnsFromResults(Protocol):
    """A sampler that wants each step's scored trajectories."""

    def observe(self, step: int, trajectories: Sequence[Trajectory]) -> None: ...
    def metrics(self) -> dict[str, float]: ...


class TaskArms:
    """One arm per task of a finite list (keys: task ids)."""

    distinct = True

    def __init__(self, tasks: list[Task]) -> None:
        self.by_id = {t.id: t for t in tasks}
        self.keys = list(self.by_id)
        self.categories = {t.id: t.category for t in tasks}

    def draw(self, key: str, rng: random.Random) -> Task:
        return self.by_id[key]

    def key_of(self, task: Task) -> str:
        return task.id

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class CategoryArms:
    """One arm per category, of a finite list (shuffled epochs per category) or a generator."""

    distinct = False

    def __init__(self, seed: int, tasks: list[Task] | None = None, generator: Any = None) -> None:
        self.seed, self.generator = seed, generator
        self.pools: dict[str, list[Task]] = {}
        for t in tasks or []:
            self.pools.setdefault(t.category, []).append(t)
        self.keys = sorted(self.pools) if tasks is not None else list(generator.categories)
        self.categories = {k: k for k in self.keys}
        self.positions = {k: [0, 0] for k in self.pools}  # category -> [epoch, pos]

    def draw(self, key: str, rng: random.Random) -> Task:
        if self.generator is not None:
            return self.generator.sample_in(rng, key)
        pool, (epoch, pos) = self.pools[key], self.positions[key]
        if pos >= len(pool):
            epoch, pos = epoch + 1, 0
        order = list(range(len(pool)))
        random.Random(f"{self.seed}:{key}:{epoch}").shuffle(order)
        self.positions[key] = [epoch, pos + 1]
        return pool[order[pos]]

    def key_of(self, task: Task) -> str:
        return task.category

    def state_dict(self) -> dict[str, Any]:
        return {"positions": {k: list(v) for k, v in self.positions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.positions = {k: [int(e), int(p)] for k, (e, p) in state["positions"].items()}


Arms = TaskArms | CategoryArms
#: (arms, sampler, k) -> chosen arm keys.
Policy = Callable[["AdaptiveSampler", int], list[str]]


class AdaptiveSampler:
    """Chooses arms with ``policy`` and learns pass rates from `observe`."""

    def __init__(self, arms: Arms, policy: Policy, seed: int, decay: float, name: str) -> None:
        if not arms.keys:
            raise TemperError("the task sampler has no tasks to choose from")
        self.arms, self.policy, self.name = arms, policy, name
        self.stats = TaskStats(decay)
        self.rng = random.Random(f"sampler:{seed}")
        self.step = 0  # the last step observed; sampling is for step + 1
        self.drawn: Counter[str] = Counter()  # categories handed out since the last observe
        self._pending: dict[str, str] = {}  # task id -> key, until its results come back

    @property
    def tasks(self) -> list[Task]:
        """The finite task list (for prompt-length checks); [] for a generator."""
        if isinstance(self.arms, TaskArms):
            return list(self.arms.by_id.values())
        return [t for pool in self.arms.pools.values() for t in pool]

    def sample(self, k: int) -> list[Task]:
        out = []
        for key in self.policy(self, k):
            task = self.arms.draw(key, self.rng)
            self._pending[task.id] = key
            self.drawn[self.arms.categories[key]] += 1
            out.append(task)
        return out

    def observe(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        outcomes = []
        for t in trajectories:
            key = self._pending.get(t.task_id)
            if key is not None and t.correct is not None and not math.isnan(t.reward):
                outcomes.append((key, bool(t.correct)))
        for t in trajectories:
            self._pending.pop(t.task_id, None)
        self.stats.update(step, outcomes)
        self.step = step

    def metrics(self) -> dict[str, float]:
        """Per category: share of the prompts drawn since the last call and pass rate (category
        arms); for task arms the number of distinct tasks seen so far."""
        total = sum(self.drawn.values()) or 1
        out = {f"sampler/share/{c}": n / total for c, n in sorted(self.drawn.items())}
        self.drawn.clear()
        if isinstance(self.arms, CategoryArms):
            for key in self.arms.keys:
                out[f"sampler/pass_rate/{key}"] = self.stats.pass_rate(key, self.step)
        else:
            out["sampler/tasks_seen"] = float(len(self.stats.keys))
        return out

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "type": self.name,
            "rng": [version, list(internal), gauss],
            "step": self.step,
            "stats": self.stats.state_dict(),
            "arms": self.arms.state_dict(),
            "pending": dict(self._pending),
            "drawn": dict(self.drawn),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("type") != self.name:
            raise TemperError(
                f"the checkpoint's task sampler is {state.get('type', 'uniform')!r}, the config's "
                f"sampler.type is {self.name!r}: resume with the sampler the run started with"
            )
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.step = int(state["step"])
        self.stats.load_state_dict(state["stats"])
        self.arms.load_state_dict(state["arms"])
        self._pending = dict(state["pending"])
        self.drawn = Counter(state["drawn"])


# ---------------------------------------------------------------------- policies
def targeted(target: float, explore: float) -> Policy:
    """Thompson draws from each arm's posterior; the draws nearest ``target`` win. A share
    ``explore`` of the draws is uniform over the arms instead, so that a category whose
    posterior is sure (many samples) is still seen and its drift noticed."""

    def choose(s: AdaptiveSampler, k: int) -> list[str]:
        step, keys = s.step + 1, s.arms.keys

        def distances() -> list[float]:
            return [abs(s.rng.betavariate(*s.stats.posterior(a, step)) - target) for a in keys]

        uniform = sum(s.rng.random() < explore for _ in range(k))
        if s.arms.distinct:  # distinct tasks per step while there are enough
            out: list[str] = []
            while len(out) < k - uniform:
                d = distances()
                ranked = sorted(range(len(keys)), key=d.__getitem__)
                out += [keys[i] for i in ranked[: k - uniform - len(out)]]
            taken = set(out)
            rest = [a for a in keys if a not in taken] or keys
            return out + [rest[s.rng.randrange(len(rest))] for _ in range(uniform)]
        chosen = []
        for _ in range(k - uniform):  # few categories: a fresh draw per prompt gives a mix
            d = distances()
            chosen.append(keys[min(range(len(keys)), key=d.__getitem__)])
        return chosen + [keys[s.rng.randrange(len(keys))] for _ in range(uniform)]

    return choose


def curriculum_weights(schedule: Sequence[CurriculumPoint], step: int) -> dict[str, float]:
    """The schedule's category weights at ``step`` (linear between points)."""
    if step <= schedule[0].step:
        return dict(schedule[0].weights)
    for a, b in itertools.pairwise(schedule):
        if a.step <= step < b.step:
            frac = (step - a.step) / (b.step - a.step)
            names = set(a.weights) | set(b.weights)
            return {
                n: (1 - frac) * a.weights.get(n, 0.0) + frac * b.weights.get(n, 0.0) for n in names
            }
    return dict(schedule[-1].weights)


def curriculum(schedule: Sequence[CurriculumPoint]) -> Policy:
    def choose(s: AdaptiveSampler, k: int) -> list[str]:
        weights = curriculum_weights(schedule, s.step + 1)
        keys = s.arms.keys
        return s.rng.choices(keys, weights=[weights.get(a, 0.0) for a in keys], k=k)

    return choose


def weighted(fn: Callable[..., Sequence[float]], spec: str) -> Policy:
    """The user's ``fn(arms, step)`` weighs each arm; draws follow the weights
    (distinct tasks per step while enough have positive weight)."""

    def choose(s: AdaptiveSampler, k: int) -> list[str]:
        step, keys = s.step + 1, s.arms.keys
        views = [{**s.stats.view(a, step), "category": s.arms.categories[a]} for a in keys]
        weights = _checked_weights(fn(views, step), len(keys), spec)
        if not s.arms.distinct:
            return s.rng.choices(keys, weights=weights, k=k)
        # Efraimidis-Spirakis: the k largest u ** (1 / w) are a weighted draw without replacement.
        ranked = sorted(
            (i for i, w in enumerate(weights) if w > 0),
            key=lambda i: math.log(1.0 - s.rng.random()) / weights[i],
            reverse=True,
        )
        out = [keys[i] for i in ranked[:k]]
        out += s.rng.choices(keys, weights=weights, k=k - len(out))
        return out

    return choose


def _checked_weights(raw: Any, n: int, spec: str) -> list[float]:
    try:
        weights = [float(w) for w in raw]
    except (TypeError, ValueError) as exc:
        raise TemperError(
            f"sampler function {spec!r} must return a list of numbers, got {type(raw).__name__}"
        ) from exc
    if len(weights) != n:
        raise TemperError(f"sampler function {spec!r} returned {len(weights)} weights for {n} arms")
    if any(not (w >= 0 and math.isfinite(w)) for w in weights) or not sum(weights) > 0:
        raise TemperError(
            f"sampler function {spec!r} must return finite weights >= 0 with a positive sum"
        )
    return weights
