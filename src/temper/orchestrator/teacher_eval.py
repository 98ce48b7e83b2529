"""The teacher's own held-out accuracy, once, before a distillation run's step 0.

A distillation run (``algo.advantage = "distill"``) shows the teacher beside the
student: the same held-out tasks, sampling and reward as the student's evals, on an
engine of the run's engine type that loads ``distill.teacher``. The result goes to
``eval/teacher.json`` and, prefixed ``eval/teacher_``, into ``metrics.jsonl`` at
step 0; the engine is closed before the student's first eval starts.
"""

from __future__ import annotations

import time
from typing import Any

from temper.builder.engines import build_engine
from temper.builder.model import load_run_model
from temper.builder.rollouts import build_rollouts
from temper.builder.tasks import RunTasks
from temper.config import Config
from temper.eval.harness import evaluate
from temper.records import Task


def teacher_config(cfg: Config) -> Config:
    """``cfg`` with the teacher as its model (the same engine, data and reward)."""
    assert cfg.distill.teacher is not None  # check_distill
    model = cfg.model.model_copy(update={"path": cfg.distill.teacher})
    return cfg.model_copy(update={"model": model})


async def evaluate_teacher(cfg: Config, tasks: RunTasks, eval_tasks: list[Task]) -> dict[str, Any]:
    """The eval harness's result for the teacher on ``eval_tasks`` (the student's
    held-out tasks, ``eval.*`` as the student's evals use them)."""
    teacher_cfg = teacher_config(cfg)
    model = load_run_model(teacher_cfg)
    engine = build_engine(teacher_cfg, model)
    t0 = time.perf_counter()
    try:
        rollouts = build_rollouts(teacher_cfg, engine, model, tasks)
        try:
            e = cfg.eval
            result = await evaluate(
                rollouts.source,
                eval_tasks,
                k=e.k,
                temperature=e.temperature,
                max_new_tokens=e.max_response_tokens or cfg.orchestrator.max_response_tokens,
                seed=cfg.run.seed + 7919,
            )
        finally:
            rollouts.close()
    finally:
        await engine.close()
    result["model"] = cfg.distill.teacher
    result["time_s"] = time.perf_counter() - t0
    return result
