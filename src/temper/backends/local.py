"""`LocalBackend`: the run's one engine in this process (``orchestrator.backend = "local"``)."""

from __future__ import annotations

from temper.backends.base import Rollouts
from temper.engine.base import Engine
from temper.weights.choose import trainer_transport
from temper.weights.transport import WeightTransport


class LocalBackend:
    """One engine in this process; weights by reference through an in-process transport."""

    def __init__(self, engine: Engine, rollouts: Rollouts) -> None:
        self.engine, self.rollouts = engine, rollouts
        self.weights: WeightTransport = trainer_transport("in_process")
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
