"""temper.rewards: score completions. `base.Reward` is the protocol (``score``, ``close``).

Verifiers: `math_verify_reward.py` (math-verify in worker processes with a hard
timeout, `process_pool.py`), `format_reward.py` (regex, exact match, JSON
schema), `tool_call_ast.py` (BFCL-style AST matching), `code_tests.py` +
`harness/` (hidden unit tests in the sandbox). Models: `reward_model.py`
(`RewardModelReward`, over HTTP or in process through `rm_batcher.py` and
`rm_scoring.py`), `judge.py` (LLM-as-judge). Users' functions: `trl_adapter.py`
(TRL's signature). Combined by `combine.py` (`WeightedSum`) behind `shaping.py`
(`GatedReward`: repetition and gibberish detectors, on by default; the DAPO
overlong penalty). Hacking detectors for code: `code_hacks.py`, `code_reach.py`.
"""

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
