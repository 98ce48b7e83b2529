"""temper.builder: one builder per config type, each fed its own config section."""

from __future__ import annotations

import asyncio
from typing import get_args

import pytest

from temper.backends.base import free_during_train
from temper.backends.local import LocalBackend
from temper.builder.backends import build_backend
from temper.builder.engines import ENGINE_BUILDERS, build_engine
from temper.builder.model import load_run_model
from temper.builder.rewards import COMPONENT_BUILDERS, build_reward
from temper.builder.rollouts import build_worker_parts
from temper.builder.tasks import build_run_tasks
from temper.config import config_from_dict
from temper.config.engine import ENGINE_CONFIGS
from temper.config.reward import RewardComponentConfig
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.errors import ConfigError
from temper.rewards.combine import WeightedSum
from temper.rewards.shaping import GatedReward


def test_every_engine_and_reward_type_has_its_builder():
    assert set(ENGINE_BUILDERS) == set(ENGINE_CONFIGS)
    union = get_args(get_args(RewardComponentConfig)[0])
    tags = {get_args(c.model_fields["type"].annotation)[0] for c in union}
    assert set(COMPONENT_BUILDERS) == tags


@pytest.mark.parametrize(("kind", "cls"), [("native", NativeEngine), ("hf", HFEngine)])
def test_an_engine_is_built_from_its_own_section(kind, cls):
    overrides = {"type": kind, "max_slots": 3} if kind == "native" else {"type": kind}
    cfg = config_from_dict({"engine": overrides})
    model = load_run_model(cfg)
    engine = build_engine(cfg, model)
    try:
        assert isinstance(engine, cls) and engine.tokenizer is model.tokenizer
        if kind == "native":
            assert engine.abilities.release_memory
    finally:
        asyncio.run(engine.close())


def test_a_setting_of_another_engine_is_an_unknown_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'engine\.max_slots' \(the hf"):
        config_from_dict({"engine": {"type": "hf", "max_slots": 3}})
    with pytest.raises(ConfigError, match=r"engine\.type: 'nope' is not one of"):
        config_from_dict({"engine": {"type": "nope"}})


def test_what_the_loop_does_with_each_engine_while_the_trainer_steps():
    def during(engine: dict) -> str:
        return config_from_dict({"engine": engine}).engine.during_train()

    assert during({}) == "release"
    assert during({"release_memory_during_train": False}) == "keep"
    assert during({"type": "hf"}) == "keep"
    assert during({"type": "vllm", "device": "cuda", "sleep": True}) == "sleep"
    assert during({"type": "openai", "base_url": "http://127.0.0.1:9/v1"}) == "keep"


def test_the_reward_is_the_weighted_sum_of_its_components_behind_the_filters():
    cfg = config_from_dict(
        {"reward": {"components": [{"type": "format"}, {"type": "exact", "weight": 2}]}}
    )
    gated = build_reward(cfg.reward)
    assert isinstance(gated, GatedReward) and isinstance(gated.inner, WeightedSum)
    assert [w for _, w in gated.inner.terms] == [1.0, 2.0]
    plain = build_reward(cfg.reward.model_copy(update={"filters": []}))
    assert isinstance(plain, WeightedSum)
    gated.close()


def test_the_run_model_is_made_once_and_handed_down(tmp_path):
    cfg = config_from_dict({"run": {"output_dir": str(tmp_path), "name": "r"}})
    model = load_run_model(cfg, images=True)
    assert model.vision is None and model.weights == model.base
    assert model.images is not None and model.images.root == tmp_path / "r" / "images"
    backend = build_backend(cfg, model, build_run_tasks(cfg))
    try:
        assert isinstance(backend, LocalBackend)
        assert backend.engine.tokenizer is model.tokenizer
        assert backend.rollouts.renderer is not None
        assert backend.rollouts.renderer.tokenizer is model.tokenizer
    finally:
        asyncio.run(backend.close())


def test_a_rollout_worker_builds_what_a_local_run_builds(tmp_path):
    cfg = config_from_dict({"run": {"output_dir": str(tmp_path)}, "data": {"eval_size": 3}})
    engine, rollouts = build_worker_parts(cfg, "tiny")
    try:
        assert isinstance(engine, NativeEngine)
        assert [t.id for t in rollouts.heldout] == [t.id for t in build_run_tasks(cfg).heldout]
    finally:
        asyncio.run(engine.close())
        rollouts.close()


def test_free_during_train_follows_the_config_and_the_abilities(tmp_path):
    cfg = config_from_dict({"run": {"output_dir": str(tmp_path)}})
    local = build_backend(cfg, load_run_model(cfg), build_run_tasks(cfg))
    calls: list[str] = []

    class Recording(LocalBackend):
        def release_memory(self) -> bool:
            calls.append("release")
            return super().release_memory()

        def sleep(self) -> None:
            calls.append("sleep")

    backend = Recording(local.engine, local.rollouts)
    try:
        assert free_during_train(backend, "release") is False and calls == ["release"]
        # The native engine declares no sleep: "sleep" does nothing rather than fail.
        assert free_during_train(backend, "sleep") is False and calls == ["release"]
        assert free_during_train(backend, "keep") is False and calls == ["release"]
    finally:
        asyncio.run(backend.close())
