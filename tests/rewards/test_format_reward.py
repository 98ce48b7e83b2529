"""FormatReward and BoxedFormatReward."""

import asyncio

from temper.records import Task
from temper.rewards import BoxedFormatReward, FormatReward, RewardInput

TEXTS = [
    "so the answer is \\boxed{72}",
    "so the answer is \\boxed{\\frac{1}{2}}  \n",
    "\\boxed{72} is what I think",
    "the answer is 72",
    "\\boxed{1} and then }",
]


def scores(reward, texts) -> list[float]:
    inputs = [RewardInput(Task(id=str(i), prompt="q"), "q", t) for i, t in enumerate(texts)]
    return [r.score for r in asyncio.run(reward.score(inputs))]


def test_default_pattern_requires_boxed_at_end():
    assert scores(FormatReward(), TEXTS) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_boxed_format_reward_counts_braces():
    reward = BoxedFormatReward()
    deep = "\\boxed{\\frac{\\sqrt{\\frac{1}{2}}}{2}}"
    assert scores(reward, [*TEXTS, deep]) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    result = asyncio.run(reward.score([RewardInput(Task(id="0", prompt="q"), "q", TEXTS[0])]))[0]
    assert result.components == {"boxed_format": 1.0} and result.correct is None


def test_custom_pattern_partial_and_full_match():
    think = FormatReward(r"<think>.*?</think>", name="think")
    texts = ["<think>a\nb</think> answer", "no think"]
    assert scores(think, texts) == [1.0, 0.0]
    full = FormatReward(r"<think>.*?</think>", full_match=True, miss_score=-1.0)
    assert scores(full, texts) == [-1.0, -1.0]
    assert scores(full, ["<think>x</think>"]) == [1.0]
