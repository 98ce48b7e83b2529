"""Synthetic preference pairs: splits are disjoint by problem / topic, pairs are reproducible."""

from __future__ import annotations

import re
from collections import Counter

from temper.data.arithmetic import Problem, is_heldout
from temper.data.preferences import FAMILIES, make_pairs, topic_is_heldout

_ARITH = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
_TOPIC = re.compile(r"(?:the|a) (\w+)(?: briefly)?[.?]")


def _key(prompt: str) -> str:
    """The problem text or the topic a prompt is about."""
    m = _ARITH.search(prompt)
    if m:
        return f"{m[1]}{m[2]}{m[3]}"
    m = _TOPIC.search(prompt)
    assert m, prompt
    return m[1]


def test_splits_share_no_problem_or_topic() -> None:
    train = make_pairs(3000, heldout=False, seed=0)
    heldout = make_pairs(600, heldout=True, seed=0)
    train_keys = {_key(p.prompt) for p in train}
    heldout_keys = {_key(p.prompt) for p in heldout}
    assert not train_keys & heldout_keys
    for p in heldout:
        m = _ARITH.search(p.prompt)
        if m:
            assert is_heldout(Problem(int(m[1]), m[2], int(m[3]), 0))
        else:
            assert topic_is_heldout(_key(p.prompt))


def test_pairs_are_reproducible_and_cover_every_family() -> None:
    a = make_pairs(800, heldout=True, seed=0)
    assert a == make_pairs(800, heldout=True, seed=0)
    assert a != make_pairs(800, heldout=True, seed=1)
    counts = Counter(p.family for p in a)
    assert set(counts) == set(FAMILIES)
    assert all(p.chosen != p.rejected for p in a)
    # Arithmetic chosen answers are the correct worked solutions.
    for p in a:
        m = _ARITH.search(p.prompt)
        if m:
            answer = Problem(int(m[1]), m[2], int(m[3]), 0).answer
            assert p.chosen.endswith(f"\\boxed{{{answer}}}")
    # Half the prompts are rendered through the chat template, as during RL.
    chat = sum(p.prompt.startswith("<|im_start|>user\n") for p in a)
    assert 0.4 < chat / len(a) < 0.6
