"""OverlongPenalty, the repetition/gibberish detectors and GatedReward."""

import asyncio
import math

import pytest

from temper.builder.rewards import build_reward
from temper.config.reward import FormatComponent, OverlongComponent, RewardConfig
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards import FormatReward, RewardInput, RewardResult, WeightedSum
from temper.rewards.base import RewardDefaults
from temper.rewards.shaping import (
    GatedReward,
    GibberishDetector,
    OverlongPenalty,
    RepetitionDetector,
)

HONEST = (
    "Janet has 16 eggs per day. She eats 3 for breakfast and bakes muffins with 4, "
    "so she uses 3 + 4 = 7 eggs. That leaves 16 - 7 = 9 eggs to sell. Each egg sells "
    "for $2, so she makes 9 * 2 = 18 dollars every day at the farmers' market. "
    "Checking: 7 eggs used plus 9 eggs sold is 16 eggs, which matches the total. "
    "So the answer is \\boxed{18}"
)
LOOP = "Let me check again. " * 40 + "\\boxed{18}"
REPLACEMENT = "The answer is " + "\ufffd\x00\x07" * 10 + " \\boxed{18}"
ONE_CHAR = "!" * 200 + " \\boxed{18}"
ONE_WORD = " ".join(["yes"] * 15) + " \\boxed{18}"


def inputs(texts, answer="18"):
    return [
        RewardInput(Task(id=str(i), prompt="q", answer=answer), "q", t) for i, t in enumerate(texts)
    ]


def run(reward, texts, answer="18") -> list[RewardResult]:
    return asyncio.run(reward.score(inputs(texts, answer)))


def test_overlong_penalty_boundaries_hand_computed():
    # L_max = 10, L_cache = 4: soft zone is 6 < |y| <= 10.
    reward = OverlongPenalty(10, 4)
    texts = [" ".join(["w"] * n) for n in (0, 5, 6, 7, 8, 9, 10, 11, 50)]
    got = [r.score for r in run(reward, texts)]
    assert got == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert run(reward, ["a b c d e f g"])[0].components == {"overlong": -0.25}


def test_overlong_penalty_length_sources():
    class Tok:
        def encode(self, text, add_special_tokens=True):
            return [0] * (len(text) + (1 if add_special_tokens else 0))

    # 9 characters -> 9 tokens (special tokens not counted): (6 - 9) / 4.
    assert run(OverlongPenalty(10, 4, tokenizer=Tok()), ["abcdefghi"])[0].score == -0.75
    assert run(OverlongPenalty(10, 4, length_fn=len), ["abcdefg"])[0].score == -0.25
    # cache == max: the ramp starts at 0 tokens.
    assert run(OverlongPenalty(4, 4), ["a b"])[0].score == -0.5
    with pytest.raises(ConfigError):
        OverlongPenalty(4, 5)


def test_repetition_detector():
    det = RepetitionDetector(n=4, threshold=0.5)
    assert det.detect(LOOP)
    assert det.repeated_share(LOOP) > 0.9
    assert not det.detect(HONEST)
    assert det.repeated_share(HONEST) < 0.1
    # Too short to judge, even if it repeats.
    assert not det.detect("a b c d a b c d a b c d")


def test_gibberish_detector():
    det = GibberishDetector()
    assert det.detect(REPLACEMENT)
    assert det.detect(ONE_CHAR)
    assert det.detect(ONE_WORD)
    assert not det.detect(HONEST)
    assert not det.detect("\\boxed{18}")
    assert not det.detect("")


def test_gate_zeroes_looping_and_garbage_answers_and_logs_kind():
    reward = GatedReward(
        WeightedSum([(FormatReward(), 1.0)]), [RepetitionDetector(), GibberishDetector()]
    )
    honest, loop, garbage, one_char = run(reward, [HONEST, LOOP, REPLACEMENT, ONE_CHAR])
    # Every text ends in \boxed{...}, so the format reward alone would give 1.0.
    assert honest.score == 1.0
    assert honest.components == {"format": 1.0, "hack/repetition": 0.0, "hack/gibberish": 0.0}
    assert loop.score == 0.0
    assert loop.components["hack/repetition"] == 1.0 and loop.components["format"] == 1.0
    assert garbage.score == 0.0 and garbage.components["hack/gibberish"] == 1.0
    assert garbage.components["hack/repetition"] == 0.0
    assert one_char.score == 0.0 and one_char.components["hack/gibberish"] == 1.0


class Fixed(RewardDefaults):
    def __init__(self, result: RewardResult) -> None:
        self.name = "fixed"
        self.result = result

    async def score(self, batch):
        return [self.result for _ in batch]


def test_gate_keeps_negative_totals_errors_and_nan():
    dets = [RepetitionDetector()]
    assert run(GatedReward(Fixed(RewardResult(-0.5)), dets), [LOOP])[0].score == -0.5
    assert run(GatedReward(Fixed(RewardResult(2.0)), dets), [LOOP])[0].score == 0.0
    err = run(GatedReward(Fixed(RewardResult(0.3, error="boom")), dets), [LOOP])[0]
    assert err.score == 0.3 and err.error == "boom" and err.components["hack/repetition"] == 1.0
    nan = run(GatedReward(Fixed(RewardResult(math.nan)), dets), [LOOP])[0]
    assert math.isnan(nan.score)
    kept = run(GatedReward(Fixed(RewardResult(1.0, correct=True)), dets), [LOOP])[0]
    assert kept.correct is True and kept.score == 0.0
    with pytest.raises(ConfigError):
        GatedReward(Fixed(RewardResult(1.0)), [RepetitionDetector(), RepetitionDetector()])


def test_config_builds_overlong_and_filters():
    cfg = RewardConfig(
        components=[
            FormatComponent(weight=1.0),
            OverlongComponent(max_tokens=100, cache_tokens=40),
        ]
    )
    assert cfg.filters == ["repetition", "gibberish"]
    reward = build_reward(cfg)
    honest, loop = run(reward, [HONEST, LOOP])
    # HONEST has 75 words: overlong = (60 - 75) / 40 = -0.375, plus format 1.0.
    assert honest.components["overlong"] == -0.375
    assert honest.score == 0.625 and honest.components["format"] == 1.0
    # LOOP has 161 words: format 1 + overlong -1 = 0, then gated (stays 0).
    assert loop.score == 0.0 and loop.components["hack/repetition"] == 1.0

    plain = build_reward(RewardConfig(components=cfg.components, filters=[]))
    assert isinstance(plain, WeightedSum)


def test_overlong_counts_the_sampled_tokens_when_it_has_them():
    """A run's rollouts pass the completion's ids: "}}}}}}}}" is one word but 8 tokens."""
    penalty = OverlongPenalty(8, 4)
    (words,) = run(penalty, ["}" * 8])  # no ids: one whitespace token
    task = Task(id="t", prompt="p")
    exact = RewardInput(task, "p", "}" * 8, completion_ids=[95] * 8)
    (tokens,) = asyncio.run(penalty.score([exact]))
    assert words.score == 0.0 and tokens.score == -1.0


def test_config_validation():
    with pytest.raises(ValueError):
        OverlongComponent(max_tokens=10)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        OverlongComponent(max_tokens=10, cache_tokens=11)
    with pytest.raises(ValueError):
        RewardConfig(filters=["nonsense"])
    with pytest.raises(ValueError):
        RewardConfig(repetition_threshold=1.5)
