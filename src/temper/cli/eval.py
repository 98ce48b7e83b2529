"""`temper eval` and `temper generate`: a model (or a run's checkpoint) on an eval suite,
and samples for one prompt."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from temper.config import Config, config_from_dict
from temper.config.load import load_config, load_run_config, run_config_path
from temper.errors import ConfigError

# torch, transformers and the builder are imported where a model is loaded, after
# the config checked out: a config error comes at once.


def _eval_config(args: argparse.Namespace, overrides: list[str]) -> Any:
    """CONFIG, else the config of the run that wrote --checkpoint, else the default run."""
    run_config = run_config_path(args.checkpoint) if args.checkpoint else None
    if args.config is None and run_config is not None:
        print(f"config: {run_config} (the checkpoint's run)", file=sys.stderr)
        return load_run_config(run_config, overrides)
    return load_config(args.config, overrides)


def cmd_eval(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.checkpoint:
        overrides = [*overrides, f"model.path={json.dumps(args.checkpoint)}"]
    cfg = _eval_config(args, overrides)
    from temper.eval.report import print_eval_table

    result = asyncio.run(run_eval(cfg, args.suite, args.suite_path))
    print_eval_table(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def cmd_generate(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides:
        raise ConfigError(f"generate takes no config overrides, got {overrides[0]!r}")
    texts = asyncio.run(
        generate_text(
            args.model, args.prompt, args.n, args.temperature, args.max_new_tokens, args.seed
        )
    )
    for i, text in enumerate(texts):
        print(f"[{i}] {text}")
    return 0


async def run_eval(
    cfg: Config, suite: str = "builtin", suite_path: str | None = None
) -> dict[str, Any]:
    """Evaluate `cfg.model.path` on eval suite `suite` (`temper.eval.suites`).

    ``builtin`` is the held-out split of `cfg.data` (or of `cfg.env`). The
    suite is checked (unknown name, missing data) before the model loads; a response
    limit set longer than the engine's context is refused.
    """
    from temper.builder.engines import build_engine, check_response_fits
    from temper.builder.model import load_run_model
    from temper.builder.suites import build_suite
    from temper.eval.harness import evaluate
    from temper.eval.suites import DEFAULT_MAX_TOKENS, check_suite, max_response_tokens

    plan = check_suite(suite, suite_path)
    model = load_run_model(cfg)
    engine = build_engine(cfg, model)
    try:
        limit = max_response_tokens(cfg, suite)
        if cfg.eval.max_response_tokens:
            check_response_fits({"eval.max_response_tokens": limit}, engine.max_context)
        elif suite not in DEFAULT_MAX_TOKENS:  # a suite's own default is clipped, not refused
            check_response_fits({"orchestrator.max_response_tokens": limit}, engine.max_context)
        rollouts = build_suite(cfg, plan, engine, model)
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
            max_new_tokens=limit,
            seed=cfg.run.seed + 7919,
        )
    finally:
        await engine.close()
        rollouts.close()
    result["model"] = model.weights
    result["suite"] = suite
    if rollouts.too_long is not None:
        result["n_prompt_too_long"] = len(rollouts.too_long)
    return result


async def generate_text(
    model: str, prompt: str, n: int, temperature: float, max_new_tokens: int, seed: int | None
) -> list[str]:
    from temper.builder.engines import build_engine
    from temper.builder.model import load_run_model
    from temper.engine.base import SamplingParams
    from temper.records import Task
    from temper.rollout.single_turn import PromptRenderer, check_prompt_fits

    cfg = config_from_dict({"model": {"path": model}})
    run_model = load_run_model(cfg)
    tokenizer = run_model.tokenizer
    engine = build_engine(cfg, run_model)
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
