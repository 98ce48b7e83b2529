"""Multi-turn episodes whose observations show images: each turn's image runs are
spliced where the template put them, the engine sees every image shown so far,
and the trainer's forward over the stored trajectory gives the engine's logprobs."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from temper.config.env import EpisodeLimits
from temper.engine.base import SamplingParams
from temper.engine.hf import HFEngine
from temper.envs.base import AssistantTurn, StepResult
from temper.records import Task
from temper.rollout.multi_turn import run_episodes
from temper.vision import ImageStore
from temper.vision.prompting import PromptImages
from tiny_llava import assert_trainer_matches_engine, picture


class PictureEnv:
    """Shows picture ``seed + turn`` each turn (turn 2 repeats turn 0's picture)."""

    tools: ClassVar[list] = []

    def __init__(self, broken_turn: int | None = None) -> None:
        self.turn, self.seed, self.broken_turn = 0, 0, broken_turn

    def _show(self, text: str) -> list[dict]:
        image = (
            b"not a png" if self.turn == self.broken_turn else picture(self.seed + self.turn % 2)
        )
        return [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": text}],
            }
        ]

    async def reset(self, task: Task, seed: int | None = None) -> list[dict]:
        self.seed = seed or 0
        return self._show("Look.")

    async def step(self, turn: AssistantTurn) -> StepResult:
        self.turn += 1
        return StepResult(self._show(f"Turn {self.turn}."), reward=0.5, done=self.turn == 3)

    async def close(self) -> None:
        pass


def _episodes(vlm, store, broken_turn=None):
    model, tokenizer, vision = vlm
    engine = HFEngine(model, tokenizer, vision=vision)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=4)
    return asyncio.run(
        run_episodes(
            engine,
            lambda task: PictureEnv(broken_turn),
            [Task(id="pic", prompt="")],
            tokenizer,
            params,
            EpisodeLimits(max_turns=4, continue_after_length=True),
            seed=1,
            group_size=2,
            images=PromptImages(vision, store),
        )
    )[0]


def test_image_observations_train_on_what_the_engine_saw(vlm, tmp_path):
    model, _, vision = vlm
    store = ImageStore(tmp_path)
    trajs = _episodes(vlm, store)
    for t in trajs:
        assert t.finish_reason == "done" and t.num_turns == 3
        ids = t.prompt_ids + t.response_ids
        # Three observations read (reset + 2 steps; the last step ends the episode),
        # one picture each, at the recorded offsets.
        assert len(t.images) == 3 and t.images[0][0] < len(t.prompt_ids)
        for offset, sha in t.images:
            run = vision.image_run(store.get(sha))
            assert ids[offset : offset + len(run)] == run
            assert (
                t.loss_mask[offset - len(t.prompt_ids)] == 0
                if offset >= len(t.prompt_ids)
                else True
            )
        # Two distinct pictures (turns alternate), stored once each.
        assert len({sha for _, sha in t.images}) == 2
        # Logged messages name images by hash; no pixels in the trajectory.
        image_parts = [
            p for m in t.messages if isinstance(m["content"], list) for p in m["content"]
            if p["type"] == "image"
        ]  # fmt: skip
        assert [p["sha256"] for p in image_parts] == [sha for _, sha in t.images]
    # Each distinct picture stored once (the episodes' seeds overlap in one picture).
    assert len(store) == len({sha for t in trajs for _, sha in t.images}) == 3
    mb = assert_trainer_matches_engine(model, trajs, vision, store)
    assert mb.response_pixels["pixel_values"].shape[0] == 4  # 2 observation images per row


def test_an_unreadable_observation_image_ends_the_episode_as_an_env_error(vlm, tmp_path):
    trajs = _episodes(vlm, ImageStore(tmp_path), broken_turn=2)
    for t in trajs:
        assert t.finish_reason == "env_error"
        assert "step 1 observation" in t.env_error and "not a readable image" in t.env_error
        assert t.num_turns == 2 and len(t.images) == 2


def test_packing_keeps_image_batches_on_the_unpacked_path(vlm, tmp_path):
    """``trainer.packing`` does not pack rows with images: they train through the
    shared-prompt micro-batches, pixels included, and the logprobs are the engine's."""
    import copy

    import torch

    from fp32 import ENGINE_PARITY
    from temper.config.schema import AlgoConfig, TrainerConfig
    from temper.trainer.batching import MicroBatch, plan_micro_batches
    from temper.trainer.policy_trainer import PolicyTrainer
    from temper.vision.processor import pixel_source

    model, _, vision = vlm
    store = ImageStore(tmp_path)
    trajs = _episodes(vlm, store)
    cfg = TrainerConfig(packing=True, lr=1e-6, warmup_steps=0)
    trainer = PolicyTrainer(
        copy.deepcopy(model), cfg, AlgoConfig(), 1, 0, pixels=pixel_source(vision, store)
    )
    assert trainer._plan(trajs) == plan_micro_batches(trajs, cfg.micro_batch_tokens)
    assert isinstance(trainer._collate(trajs, [0, 1]), MicroBatch)
    trainer.train_step(trajs)
    for t in trajs:
        sampled = torch.tensor(t.loss_mask, dtype=torch.bool)
        got = torch.tensor(t.trainer_logprobs)[sampled]
        torch.testing.assert_close(
            got, torch.tensor(t.behaviour_logprobs)[sampled], **ENGINE_PARITY
        )
