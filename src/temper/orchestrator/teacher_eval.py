"""The teacher's own held-out accuracy, once, before a distillation run's step 0.

A distillation run (``algo.advantage = "distill"``) shows the teacher beside the
student: the same held-out tasks, sampling and reward as the student's evals, on an
engine of the run's engine type that loads ``distill.teacher`` (a served teacher:
an ``openai`` engine on its URL). The result goes to
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
from temper.config.distill import is_remote_teacher
from temper.config.engine import OpenAIEngineConfig
from temper.eval.harness import evaluate
from temper.records import Task
from temper.rollout.remote_teacher import completions_url


def teacher_config(cfg: Config) -> Config:
    """``cfg`` with the teacher as its model (the same engine, data and reward). A
    served teacher (a URL) is asked through an ``openai`` engine instead, with the
    student's tokenizer (which the teacher shares: `temper.rollout.remote_teacher`)."""
    d = cfg.distill
    assert d.teacher is not None  # check_distill
    if is_remote_teacher(d.teacher):
        engine = OpenAIEngineConfig(
            base_url=completions_url(d.teacher),
            model_name=d.teacher_model,
            timeout_s=d.teacher_timeout_s,
        )
        return cfg.model_copy(update={"engine": engine})
    model = cfg.model.model_copy(update={"path": d.teacher})
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
