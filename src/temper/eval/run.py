"""Stand-alone eval and generation (the `temper eval` / `temper generate` commands)."""

from __future__ import annotations

from typing import Any

from temper.config import Config
from temper.engine.base import SamplingParams
from temper.eval.harness import evaluate
from temper.models import load_tokenizer, resolve_model_path
from temper.orchestrator.build import build_engine, build_rollouts
from temper.rollout.single_turn import PromptRenderer, check_prompt_fits


async def run_eval(cfg: Config) -> dict[str, Any]:
    """Evaluate `cfg.model.path` on the held-out split of `cfg.data` (or of `cfg.env`)."""
    model_path = str(resolve_model_path(cfg.model.path))
    tokenizer = load_tokenizer(model_path)
    engine = build_engine(cfg, model_path, tokenizer)
    rollouts = build_rollouts(cfg, engine, tokenizer)
    tasks = rollouts.heldout
    if cfg.eval.size:
        tasks = tasks[: cfg.eval.size]
    try:
        result = await evaluate(
            rollouts.source,
            tasks,
            k=cfg.eval.k,
            temperature=cfg.eval.temperature,
            max_new_tokens=cfg.eval.max_response_tokens or cfg.orchestrator.max_response_tokens,
            seed=cfg.run.seed + 7919,
        )
    finally:
        await engine.close()
        rollouts.close()
    result["model"] = model_path
    return result


async def generate_text(
    model: str, prompt: str, n: int, temperature: float, max_new_tokens: int, seed: int | None
) -> list[str]:
    from temper.config import config_from_dict
    from temper.data.base import Task

    cfg = config_from_dict({"model": {"path": model}})
    model_path = str(resolve_model_path(cfg.model.path))
    tokenizer = load_tokenizer(model_path)
    engine = build_engine(cfg, model_path, tokenizer)
    try:
        task = Task(id="cli", prompt=prompt)
        ids, _ = PromptRenderer(tokenizer).render(task)
        check_prompt_fits(task, ids, engine.max_context)
        params = SamplingParams(
            n=n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed
        )
        result = await engine.generate(ids, params)
    finally:
        await engine.close()
    return [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in result.samples]
