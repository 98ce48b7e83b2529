"""Task samplers with checkpointable state.

`ListSampler` walks a finite dataset in shuffled epochs (without replacement
inside an epoch). `ProceduralSampler` draws from a generator such as the
built-in arithmetic tasks. Both expose `state_dict()`/`load_state_dict()` so a
resumed run draws exactly the tasks the uninterrupted run would have drawn.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from temper.errors import TemperError
from temper.records import Task


class TaskGenerator(Protocol):
    def sample(self, rng: random.Random, k: int) -> list[Task]: ...


class TaskSampler(Protocol):
    """Draws the tasks of each step; its state resumes the same draws."""

    @property
    def tasks(self) -> list[Task]:
        """The finite task list it draws from (for checks before the run), or [] for a
        generator: procedural tasks are drawn, never listed."""
        ...

    def sample(self, k: int) -> list[Task]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ListSampler:
    def __init__(self, tasks: list[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("ListSampler needs at least one task")
        self.tasks = tasks
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def sample(self, k: int) -> list[Task]:
        out = []
        for _ in range(k):
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._permutation(self.epoch)
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_uniform(state)
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._permutation(self.epoch)


class ProceduralSampler:
    def __init__(self, generator: TaskGenerator, seed: int) -> None:
        self.generator = generator
        self.rng = random.Random(seed)
        self.drawn = 0

    @property
    def tasks(self) -> list[Task]:
        return []

    def sample(self, k: int) -> list[Task]:
        self.drawn += k
        return self.generator.sample(self.rng, k)

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_uniform(state)
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.drawn = int(state["drawn"])


def _check_uniform(state: dict[str, Any]) -> None:
    """Refuse the state of an adaptive sampler (temper.data.task_sampling), which says its type."""
    if "type" in state:
        raise TemperError(
            f"the checkpoint's task sampler is {state['type']!r}, the config's sampler.type is "
            "'uniform': resume with the sampler the run started with"
        )
