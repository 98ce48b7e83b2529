"""`RolloutBackend`: where a run's rollouts are made, and how its engines get weights.

The orchestrator holds exactly one backend and never an engine. A backend owns

- `rollouts`: the run's rollout source with its tasks (`Rollouts`);
- `weights`: the `WeightTransport` its engines receive from (chosen for where
  the engines are by `temper.weights.choose`);
- the engine-side abilities the loop may use (`abilities`, from
  `temper.engine.base.EngineAbilities`): release memory, sleep/wake, metrics.

Implementations: `temper.backends.local.LocalBackend` (one engine in this
process, an in-process transport) and `temper.backends.remote.RemoteBackend`
(engines in worker processes or Ray actors, a shared-memory ring).
`publish_weights` is the only way the loop hands new weights to engines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from temper import compute
from temper.config.engine import DuringTrain
from temper.data.sampler import TaskSampler
from temper.engine.base import EngineAbilities
from temper.envs.registry import EnvSpec
from temper.records import Task
from temper.rewards.base import Reward
from temper.rollout.single_turn import PromptRenderer
from temper.rollout.sources import RolloutSource
from temper.weights.transport import WeightTransport


@dataclass
class Rollouts:
    """A run's rollout source with its tasks (and the reward and env it owns, to close)."""

    source: RolloutSource
    train: TaskSampler
    heldout: list[Task]
    reward: Reward | None
    renderer: PromptRenderer | None  # single-turn runs only: to check prompt lengths
    env_spec: EnvSpec | None = None
    #: What else the source holds open (an agent run's gateway), closed here too.
    close_source: Callable[[], None] | None = None

    def close(self) -> None:
        """Close the reward's workers, the env spec's shared resources and the source's."""
        if self.close_source is not None:
            self.close_source()
        if self.reward is not None:
            self.reward.close()
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


def free_during_train(backend: RolloutBackend, during: DuringTrain) -> bool:
    """Free the engines' memory while the trainer steps, as the engine config asks
    (``during``) and the backend can; True when they sleep (wake them after)."""
    if during == "sleep" and backend.abilities.sleep:
        backend.sleep()  # colocated on a GPU: weights and cache freed
        return True
    if during == "release" and backend.abilities.release_memory:
        backend.release_memory()
    return False
