"""`RolloutBackend`: where a run's rollouts are made, and how its engines get weights.

The orchestrator holds exactly one backend and never an engine. A backend owns

- `rollouts`: the run's rollout source with its tasks (`Rollouts`);
- `weights`: the `WeightTransport` its engines receive from (chosen by placement,
  see `temper.weights.placement`);
- the engine-side abilities the loop may use (`abilities`, from
  `temper.engine.base.EngineAbilities`): release memory, sleep/wake, metrics.

Implementations: `LocalBackend` (one engine in this process, an in-process
transport) and `temper.orchestrator.remote.rollouts.RemoteBackend` (engines in
worker processes or Ray actors, a shared-memory ring). `publish_weights` is the
only way the loop hands new weights to engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from temper import compute
from temper.data.base import Task
from temper.data.sampler import TaskSampler
from temper.engine.base import Engine, EngineAbilities
from temper.rewards.base import Reward
from temper.rollout.single_turn import PromptRenderer
from temper.rollout.sources import RolloutSource
from temper.weights.placement import local_transport
from temper.weights.transport import WeightTransport


@dataclass
class Rollouts:
    """A run's rollout source with its tasks (and the reward and env it owns, to close)."""

    source: RolloutSource
    train: TaskSampler
    heldout: list[Task]
    reward: Reward | None
    renderer: PromptRenderer | None  # single-turn runs only: to check prompt lengths
    env_spec: Any = None

    def close(self) -> None:
        """Close the reward's workers and the env spec's shared resources."""
        close = getattr(self.reward, "close", None)  # rewards with worker processes
        if close is not None:
            close()
        if self.env_spec is not None and self.env_spec.close is not None:
            self.env_spec.close()


@runtime_checkable
class RolloutBackend(Protocol):
    """Rollout source + engines + the weight transport that reaches them."""

    rollouts: Rollouts
    weights: WeightTransport
    abilities: EngineAbilities
    max_context: int
    #: The weight version every engine holds (set on resume: only the number moves).
    version: int

    def load_weights(self, version: int) -> None:
        """Have every engine load ``version`` from `weights`; returns once they hold it."""
        ...

    def release_memory(self) -> bool: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    async def close(self) -> None:
        """Stop the engines and close the rollouts' reward and env."""
        ...


def publish_weights(
    backend: RolloutBackend, state_dict: Mapping[str, torch.Tensor], version: int
) -> None:
    """Publish the trainer's ``state_dict`` as ``version`` and have the engines load it."""
    compute.run(backend.weights.publish, state_dict, version)
    backend.load_weights(version)


class LocalBackend:
    """One engine in this process; weights by reference through an in-process transport."""

    def __init__(self, engine: Engine, rollouts: Rollouts) -> None:
        self.engine, self.rollouts = engine, rollouts
        self.weights: WeightTransport = local_transport()
        self.abilities = engine.abilities
        self.max_context = engine.max_context

    @property
    def version(self) -> int:
        return self.engine.version

    @version.setter
    def version(self, value: int) -> None:
        self.engine.version = int(value)

    def load_weights(self, version: int) -> None:
        self.engine.load_weights(self.weights, version)

    def release_memory(self) -> bool:
        return self.engine.release_memory()

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics()

    async def close(self) -> None:
        try:
            await self.engine.close()
        finally:
            self.rollouts.close()
