"""Rewards: score completions. See `base.Reward` for the protocol."""

from temper.rewards.answers import (
    extract_boxed,
    extract_gsm8k_answer,
    find_last_boxed,
    normalize_gold_answer,
)
from temper.rewards.base import Reward, RewardInput, RewardResult
from temper.rewards.combine import WeightedSum
from temper.rewards.format_reward import BOXED_AT_END, BoxedFormatReward, FormatReward
from temper.rewards.math_verify_reward import MathVerifyReward, verify_answer
from temper.rewards.process_pool import Outcome, ProcessPool
from temper.rewards.trl_adapter import TRLRewardFunction, load_reward_function

__all__ = [
    "BOXED_AT_END",
    "BoxedFormatReward",
    "FormatReward",
    "MathVerifyReward",
    "Outcome",
    "ProcessPool",
    "Reward",
    "RewardInput",
    "RewardResult",
    "TRLRewardFunction",
    "WeightedSum",
    "extract_boxed",
    "extract_gsm8k_answer",
    "find_last_boxed",
    "load_reward_function",
    "normalize_gold_answer",
    "verify_answer",
]
