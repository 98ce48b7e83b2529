"""Stand-alone eval and generation (the `temper eval` / `temper generate` commands)."""

from __future__ import annotations

from typing import Any

from temper.config import Config
from temper.engine.base import SamplingParams
from temper.eval.harness import evaluate
from temper.eval.suites import build_suite, check_suite, max_response_tokens
from temper.models import load_tokenizer, resolve_model_path
from temper.orchestrator.build import build_engine
from temper.rollout.single_turn import PromptRenderer, check_prompt_fits


async def run_eval(
    cfg: Config, suite: str = "builtin", suite_path: str | None = None
) -> dict[str, Any]:
    """Evaluate `cfg.model.path` on eval suite `suite` (`temper.eval.suites`).

    ``builtin`` is the held-out split of `cfg.data` (or of `cfg.env`). The
    suite is checked (unknown name, missing data) before the model loads.
    """
    plan = check_suite(suite, suite_path)
    model_path = str(resolve_model_path(cfg.model.path))
    tokenizer = load_tokenizer(model_path)
    engine = build_engine(cfg, model_path, tokenizer)
    try:
        rollouts = build_suite(cfg, plan, engine, tokenizer)
    except BaseException:
        await engine.close()
        raise
    tasks = rollouts.tasks
    if cfg.eval.size:
        tasks = tasks[: cfg.eval.size]
    try:
        result = await evaluate(
            rollouts.source,
            tasks,
            k=cfg.eval.k,
            temperature=cfg.eval.temperature,
            max_new_tokens=max_response_tokens(cfg, suite),
            seed=cfg.run.seed + 7919,
        )
    finally:
        await engine.close()
        rollouts.close()
    result["model"] = model_path
    result["suite"] = suite
    too_long = getattr(rollouts.source, "too_long", None)
    if too_long is not None:
        result["n_prompt_too_long"] = len(too_long)
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
