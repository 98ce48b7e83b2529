"""Rewards from their config: one builder per ``reward.components[].type``
(`temper.config.reward`), summed with their weights and gated by the hacking filters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.config import Config
from temper.config.reward import (
    ExactComponent,
    FormatComponent,
    JSONSchemaComponent,
    JudgeComponent,
    MathComponent,
    OverlongComponent,
    PythonComponent,
    RewardConfig,
    RewardModelComponent,
    ToolCallASTComponent,
)
from temper.http_client import api_key_from_env
from temper.records import Task
from temper.rewards.base import Reward
from temper.rewards.combine import CorrectAbove, WeightedSum
from temper.rewards.shaping import Detector, GatedReward, GibberishDetector, RepetitionDetector


def _math(cfg: RewardConfig, c: MathComponent, tokenizer: Any) -> Reward:
    from temper.rewards.math_verify_reward import MathVerifyReward

    return MathVerifyReward(timeout_s=cfg.timeout_s, workers=cfg.workers)


def _format(cfg: RewardConfig, c: FormatComponent, tokenizer: Any) -> Reward:
    from temper.rewards.format_reward import FormatReward

    return FormatReward(c.pattern) if c.pattern else FormatReward()


def _exact(cfg: RewardConfig, c: ExactComponent, tokenizer: Any) -> Reward:
    from temper.rewards.format_reward import ExactMatchReward

    return ExactMatchReward()


def _python(cfg: RewardConfig, c: PythonComponent, tokenizer: Any) -> Reward:
    from temper.rewards.trl_adapter import TRLRewardFunction, load_reward_function

    return TRLRewardFunction(load_reward_function(c.function))


def _overlong(cfg: RewardConfig, c: OverlongComponent, tokenizer: Any) -> Reward:
    from temper.rewards.shaping import OverlongPenalty

    return OverlongPenalty(c.max_tokens, c.cache_tokens, tokenizer=tokenizer)


def _json_schema(cfg: RewardConfig, c: JSONSchemaComponent, tokenizer: Any) -> Reward:
    from temper.rewards.format_reward import JSONSchemaReward

    return JSONSchemaReward(c.json_schema, schema_field=c.schema_field)


def _tool_call_ast(cfg: RewardConfig, c: ToolCallASTComponent, tokenizer: Any) -> Reward:
    from temper.rewards.tool_call_ast import ToolCallASTReward

    return ToolCallASTReward(c.ground_truth_field, c.functions_field)


def _reward_model(cfg: RewardConfig, c: RewardModelComponent, tokenizer: Any) -> Reward:
    from temper.rewards.reward_model import RewardModelReward

    return RewardModelReward(base_url=c.base_url, model=c.model)


def _judge(cfg: RewardConfig, c: JudgeComponent, tokenizer: Any) -> Reward:
    from temper.rewards.judge import JudgeReward

    key = api_key_from_env(c.api_key_env, "reward.components[].api_key_env") or "EMPTY"
    return JudgeReward(c.base_url, c.model, key)


#: ``reward.components[].type`` -> its builder, ``(reward config, component, tokenizer)``.
COMPONENT_BUILDERS: dict[str, Callable[[RewardConfig, Any, Any], Reward]] = {
    "math": _math,
    "format": _format,
    "exact": _exact,
    "python": _python,
    "overlong": _overlong,
    "json_schema": _json_schema,
    "tool_call_ast": _tool_call_ast,
    "reward_model": _reward_model,
    "judge": _judge,
}


def build_reward(cfg: RewardConfig, tokenizer: Any = None) -> Reward:
    """The weighted sum of ``cfg.components``, gated by ``cfg.filters`` when any are on.

    ``tokenizer`` measures lengths for ``overlong``; without it they are
    whitespace-separated words.
    """
    parts: list[tuple[Reward, float]] = []
    for c in cfg.components:
        part = COMPONENT_BUILDERS[c.type](cfg, c, tokenizer)
        if c.correct_above is not None:  # the component's verdict, declared by a threshold
            part = CorrectAbove(part, c.correct_above)
        parts.append((part, c.weight))
    total: Reward = WeightedSum(parts, on_error=cfg.on_error)
    detectors: list[Detector] = []
    if "repetition" in cfg.filters:
        detectors.append(RepetitionDetector(cfg.repetition_ngram, cfg.repetition_threshold))
    if "gibberish" in cfg.filters:
        detectors.append(GibberishDetector(cfg.gibberish_threshold))
    return GatedReward(total, detectors) if detectors else total


def check_reward_functions(cfg: Config, tasks: list[Task]) -> None:
    """Call-check each ``type = "python"`` reward function's signature against the
    columns of ``tasks``, at the start of a run, before any generation or eval."""
    if cfg.env.enabled and not cfg.env.add_reward and not cfg.agent.enabled:
        return  # the env scores its episodes: the reward section is not used
    from temper.rewards.trl_adapter import TRLRewardFunction, load_reward_function

    columns = {key for task in tasks for key in task.columns}
    for c in cfg.reward.components:
        if isinstance(c, PythonComponent):
            TRLRewardFunction(load_reward_function(c.function)).check_signature(columns)
