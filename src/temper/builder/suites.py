"""Eval suites from their name and the run config: what `temper eval --suite NAME` runs
(the suites themselves, and why each is scored as it is: `temper.eval.suites`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.backends.base import Rollouts
from temper.builder.model import RunModel
from temper.builder.rollouts import build_rollouts
from temper.builder.tasks import build_run_tasks
from temper.config import Config
from temper.config.env import EnvConfig, EpisodeLimits
from temper.config.reward import ExactComponent, MathComponent, RewardConfig
from temper.config.schema import DataConfig
from temper.engine.base import Engine
from temper.errors import ConfigError
from temper.eval.suites import (
    GSM8K_SYSTEM_PROMPT,
    ContextFitRollouts,
    EpisodeFitRollouts,
    SuitePlan,
    SuiteRollouts,
)
from temper.records import Task


def _rollouts(cfg: Config, engine: Engine, model: RunModel) -> Rollouts:
    return build_rollouts(cfg, engine, model, build_run_tasks(cfg))


def _episode_measure(tokenizer: Any) -> Callable[[Task], int]:
    from temper.models.chat_template import IncrementalRenderer

    def measure(task: Task) -> int:
        tools = task.columns.get("tools") or None
        return len(IncrementalRenderer(tokenizer, tools).prompt(task.messages())[0])

    return measure


def build_suite(cfg: Config, plan: SuitePlan, engine: Engine, model: RunModel) -> SuiteRollouts:
    """The rollout source and tasks of a checked suite, for ``engine``."""
    if plan.name == "builtin":
        r = _rollouts(cfg, engine, model)
        return SuiteRollouts(r.source, list(r.heldout), r.close)
    if plan.name == "gsm8k":
        return _gsm8k(cfg, plan, engine, model)
    if plan.name == "humaneval":
        return _humaneval(cfg, engine, model)
    if plan.name == "miniwob":
        return _miniwob(cfg, engine, model)
    if plan.name == "vision":
        return _vision(cfg, engine, model)
    return _bfcl(cfg, plan, engine, model)


def _gsm8k(cfg: Config, plan: SuitePlan, engine: Engine, model: RunModel) -> SuiteRollouts:
    """The GSM8K file as the held-out data of a single-turn run scored by math-verify."""
    assert plan.path is not None
    suite_cfg = cfg.model_copy(deep=True)
    suite_cfg.env = EnvConfig()  # single-turn
    suite_cfg.data = DataConfig(
        type="file",
        path=str(plan.path),
        eval_path=str(plan.path),
        prompt_field="question",
        answer_field="answer",
        answer_extractor="gsm8k",
        system_prompt=cfg.data.system_prompt or GSM8K_SYSTEM_PROMPT,
        eval_size=10**9,  # every problem
    )
    # Eval measures correctness: no reward-hacking gates, no shaping.
    suite_cfg.reward = RewardConfig(
        components=[MathComponent()],
        filters=[],
        timeout_s=cfg.reward.timeout_s,
        workers=cfg.reward.workers,
    )
    r = _rollouts(suite_cfg, engine, model)
    for task in r.heldout:
        task.category = "gsm8k"
    renderer = r.renderer
    assert renderer is not None
    source = ContextFitRollouts(r.source, lambda t: len(renderer.render(t)[0]), engine.max_context)
    return SuiteRollouts(source, list(r.heldout), r.close, source.too_long)


def _humaneval(cfg: Config, engine: Engine, model: RunModel) -> SuiteRollouts:
    """HumanEval as the held-out set of the code env (the user's code-env options kept)."""
    suite_cfg = cfg.model_copy(deep=True)
    options = dict(cfg.env.options) if cfg.env.type == "code" else {}
    options["eval_set"] = "humaneval"
    suite_cfg.env = cfg.env.model_copy(
        update={"type": "code", "options": options, "add_reward": False}
    )
    r = _rollouts(suite_cfg, engine, model)
    limits = suite_cfg.env.limits
    room = min(limits.max_total_tokens or engine.max_context, engine.max_context)
    source = ContextFitRollouts(r.source, _episode_measure(model.tokenizer), room)
    return SuiteRollouts(source, list(r.heldout), r.close, source.too_long)


def _miniwob(cfg: Config, engine: Engine, model: RunModel) -> SuiteRollouts:
    """Held-out MiniWoB++ instances of the miniwob env (the user's options kept)."""
    suite_cfg = cfg.model_copy(deep=True)
    options = dict(cfg.env.options) if cfg.env.type == "miniwob" else {}
    suite_cfg.env = cfg.env.model_copy(
        update={"type": "miniwob", "options": options, "add_reward": False}
    )
    r = _rollouts(suite_cfg, engine, model)
    limits = suite_cfg.env.limits
    room = min(limits.max_total_tokens or engine.max_context, engine.max_context)
    source = EpisodeFitRollouts(r.source, room)
    return SuiteRollouts(source, list(r.heldout), r.close, source.too_long)


def _vision(cfg: Config, engine: Engine, model: RunModel) -> SuiteRollouts:
    """Held-out visual tasks, single-turn, scored by exact match of the boxed answer."""
    if not engine.abilities.images:
        raise ConfigError(
            f"eval suite vision needs a vision-language model on an engine that takes images; "
            f"{type(engine).__name__} with model {cfg.model.path!r} takes none"
        )
    suite_cfg = cfg.model_copy(deep=True)
    suite_cfg.env = EnvConfig()  # single-turn
    data = cfg.data if cfg.data.type == "visual" else DataConfig(type="visual")
    suite_cfg.data = data.model_copy(update={"type": "visual"})
    # Eval measures correctness: no reward-hacking gates, no shaping.
    suite_cfg.reward = RewardConfig(components=[ExactComponent()], filters=[])
    r = _rollouts(suite_cfg, engine, model)
    renderer = r.renderer
    assert renderer is not None
    source = ContextFitRollouts(r.source, lambda t: len(renderer.render(t)[0]), engine.max_context)
    return SuiteRollouts(source, list(r.heldout), r.close, source.too_long)


def _bfcl(cfg: Config, plan: SuitePlan, engine: Engine, model: RunModel) -> SuiteRollouts:
    from temper.eval.bfcl import bfcl_spec, load_bfcl_tasks
    from temper.rollout.sources import EpisodeRollouts

    assert plan.path is not None
    tasks = load_bfcl_tasks(plan.path)
    limits = EpisodeLimits(max_turns=1, timeout_s=cfg.env.limits.timeout_s)
    inner = EpisodeRollouts(engine, bfcl_spec(tasks), model.tokenizer, limits, None)
    source = ContextFitRollouts(inner, _episode_measure(model.tokenizer), engine.max_context)
    return SuiteRollouts(source, tasks, too_long=source.too_long)
