"""Run directories of a vision-language model, written by the real rollout code.

`make_vision_runs(root)` rolls out the built-in tiny VLM (``tiny_vlm``, a LLaVA)
through the HF engine and writes what `temper train` writes: the trajectories
(`RunDir.write_trajectories`) and each image once in the run's image store.

- "vision": single-turn picture questions (`data.type = "visual"` tasks), plus
  one prompt that shows two pictures back to back (their token runs touch).
- "grid": multi-turn `visual_grid` episodes, whose observations are pictures.

No training step: the dashboard shows what rollouts store, and a rollout of
the tiny model takes a second where a training run takes half a minute.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from temper.builder.model import run_image_store
from temper.config import load_config
from temper.config.env import EpisodeLimits
from temper.data.visual import render, to_task
from temper.engine.base import SamplingParams
from temper.envs.visual_grid import GridTasks, VisualGridEnv
from temper.orchestrator.run_dir import RunDir
from temper.records import Task
from temper.rollout.multi_turn import run_episodes
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.vision.prompting import PromptImages


def _two_pictures() -> Task:
    a, b = render("count", 11).image, render("number", 12).image
    content = [
        {"type": "image", "image": a},
        {"type": "image", "image": b},
        {"type": "text", "text": "Are these the same picture?"},
    ]
    return Task(id="two-pictures", prompt=[{"role": "user", "content": content}])


def make_vision_runs(root: Path) -> Path:
    """Write runs "vision" (single-turn) and "grid" (multi-turn) under root."""
    from temper.engine.hf import HFEngine
    from temper.models import load_model, load_tokenizer
    from temper.models.loader import resolve_model_path
    from temper.vision.processor import VisionProcessor

    path = resolve_model_path("tiny_vlm")
    tokenizer = load_tokenizer(str(path))
    vision = VisionProcessor.from_pretrained(str(path))
    engine = HFEngine(load_model(str(path)), tokenizer, vision=vision)
    for name in ("vision", "grid"):
        cfg = load_config(
            None,
            [
                f"run.output_dir={json.dumps(str(root))}",
                f"run.name={name}",
                'model.path="tiny_vlm"',
            ],
        )
        run = RunDir.prepare(cfg)
        store = run_image_store(cfg)
        # Room for a whole move ("\\boxed{right}" is 7 tokens): a cut-off move gets a
        # text error back, not a picture.
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
        if name == "vision":
            tasks = [to_task(render("count", 5)), _two_pictures()]
            renderer = PromptRenderer(tokenizer, vision=vision, store=store)
            groups = asyncio.run(rollout_groups(engine, renderer, tasks, params, seed=1))
            trajs = [t for g in groups for t in g]
        else:
            tasks = [GridTasks(4, 3, 3).task(key) for key in (7, 8)]
            trajs = asyncio.run(
                run_episodes(
                    engine,
                    lambda task: VisualGridEnv(),
                    tasks,
                    tokenizer,
                    params,
                    EpisodeLimits(max_turns=3, continue_after_length=True),
                    seed=2,
                    group_size=1,
                    images=PromptImages(vision, store),
                )
            )
            trajs = [t for g in trajs for t in g]
        run.write_trajectories(1, trajs)
        run.metrics.write_text(json.dumps({"step": 1, "reward_mean": 0.0}) + "\n")
    return root
