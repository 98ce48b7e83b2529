"""The local `RolloutBackend`: abilities from its engine, weights only through its transport."""

from __future__ import annotations

import asyncio

import torch

from temper.backends.base import RolloutBackend, publish_weights
from temper.backends.local import LocalBackend
from temper.builder.backends import build_backend
from temper.builder.model import load_run_model
from temper.builder.tasks import build_run_tasks
from temper.config import config_from_dict
from temper.engine.base import SamplingParams
from temper.models import load_model, resolve_model_path
from temper.weights.transport import InProcessTransport


def test_local_backend_publishes_through_its_transport_and_declares_its_engines_abilities():
    cfg = config_from_dict({"run": {"seed": 1}, "data": {"eval_size": 4}})
    path = str(resolve_model_path("tiny"))
    backend = build_backend(cfg, load_run_model(cfg), build_run_tasks(cfg))
    try:
        assert isinstance(backend, LocalBackend) and isinstance(backend, RolloutBackend)
        assert backend.abilities.release_memory and not backend.abilities.sleep
        assert isinstance(backend.weights, InProcessTransport)
        task = backend.rollouts.heldout[0]
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
        before, _ = asyncio.run(backend.rollouts.source.groups([task], greedy, seed=0))
        state = load_model(path).state_dict()
        gen = torch.Generator().manual_seed(0)
        state = {k: v + 0.2 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
        publish_weights(backend, state, 1)
        assert backend.version == 1 and backend.weights.latest_version() == 1
        after, _ = asyncio.run(backend.rollouts.source.groups([task], greedy, seed=0))
        assert after[0][0].versions[-1] == 1
        assert after[0][0].response_ids != before[0][0].response_ids  # the new weights ran
        assert backend.release_memory() is True  # idle: the native engine frees its cache
    finally:
        asyncio.run(backend.close())
