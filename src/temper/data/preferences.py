"""Synthetic preference pairs for training and checking the built-in tiny reward model.

Each `PreferencePair` is a prompt, a chosen response, a rejected response and a
family naming what the rejected one gets wrong:

- ``arith_careless``: a worked arithmetic solution that forgets a carry or a
  borrow (same format, wrong steps and answer) against the correct one.
- ``arith_blurt``: a bare ``\\boxed{N}`` with a wrong N against the worked solution.
- ``arith_unboxed``: the right steps but no ``\\boxed{}`` answer (wrong format).
- ``arith_wrong_box``: the right steps, then a different number boxed.
- ``arith_ramble``: filler sentences (sometimes followed by the right answer).
- ``help_offtopic``: a sentence about another topic than the one asked about.
- ``help_refusal``: a refusal or a non-answer.
- ``help_repeat``: the topic word repeated over and over.

The chosen response of an arithmetic pair is always
`temper.data.arithmetic.worked_solution` (correct); of a helpfulness pair, a
sentence about the asked topic. Prompts are the user text, or (half the time)
that text rendered through the ChatML template with the generation prompt,
which is what `prompt_text` looks like during RL.

The split is by prompt content, never by pair: an arithmetic problem is held
out exactly when `temper.data.arithmetic.is_heldout` says so (the same split
the tiny policy was pretrained on), a helpfulness topic when a salted sha256 of
the topic says so. So no held-out prompt, problem or topic is ever trained on.
This module does no tokenisation and loads no model.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from temper.data.arithmetic import (
    Problem,
    is_heldout,
    make_problem,
    mistake_for,
    solve,
    worked_solution,
)

ARITH_FAMILIES = (
    "arith_careless",
    "arith_blurt",
    "arith_unboxed",
    "arith_wrong_box",
    "arith_ramble",
)
HELP_FAMILIES = ("help_offtopic", "help_refusal", "help_repeat")
FAMILIES = ARITH_FAMILIES + HELP_FAMILIES
#: Share of pairs that are arithmetic pairs.
ARITH_SHARE = 0.75
LEVELS = (1, 2, 3, 4)

_TOPIC_SALT = "temper-prefs-v1:"
TOPICS = (
    "apple", "bicycle", "river", "mountain", "library", "garden", "violin", "ocean",
    "candle", "bridge", "forest", "window", "planet", "kitchen", "island", "rocket",
    "pencil", "castle", "desert", "lantern", "meadow", "harbor", "tiger", "orchard",
    "glacier", "market", "piano", "volcano", "compass", "village", "engine", "feather",
    "teacher", "museum", "blanket", "thunder", "camera", "basket", "dolphin", "ladder",
    "mirror", "rabbit", "station", "tunnel", "umbrella", "wallet", "yogurt", "zebra",
    "anchor", "bakery", "cactus", "diamond", "eagle", "fountain", "guitar", "hammer",
    "iceberg", "jacket", "kettle", "lemon", "magnet", "needle", "oyster", "parrot",
    "quilt", "saddle", "tractor", "valley", "whistle", "bottle", "cotton", "dragon",
    "elbow", "falcon", "ginger", "helmet", "insect", "jungle", "koala", "lobster",
    "marble", "nectar", "olive", "pepper", "raven", "salmon", "tomato", "velvet",
    "walnut", "canyon", "puzzle", "sunset", "turtle", "wizard", "button", "cookie",
)  # fmt: skip
_HELP_PROMPTS = (
    "Tell me something about the {t}.",
    "Write one sentence about a {t}.",
    "What can you say about the {t}?",
    "Describe a {t} briefly.",
)
_HELP_ANSWERS = (
    "A {t} is something many people have seen, and the {t} is easy to describe.",
    "Here is a sentence about the {t}: the {t} stood there in the morning light.",
    "The {t} is a familiar thing; people often talk about the {t}.",
)
_REFUSALS = (
    "I don't know.",
    "Sorry, I cannot help with that.",
    "ok",
    "That is a question.",
    "I would rather not say.",
)
_FILLER = (
    "Let me think about this.",
    "Numbers are interesting.",
    "Hmm, this is a question about math.",
    "I like to take my time.",
    "There are many ways to look at it.",
    "Well, well, well.",
)
_CHAT = "<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: ``chosen`` should score above ``rejected`` for ``prompt``."""

    prompt: str
    chosen: str
    rejected: str
    family: str


def user_text(prompt: str) -> str:
    """A pair's prompt as the user's own text: the ChatML rendering that half the
    prompts carry (see the module docstring) taken off, so a policy can render it
    through its own chat template."""
    head, tail = _CHAT.split("{u}")
    if prompt.startswith(head) and prompt.endswith(tail) and len(prompt) > len(head + tail):
        return prompt[len(head) : -len(tail)]
    return prompt


def topic_is_heldout(topic: str, percent: int = 20) -> bool:
    """True if a helpfulness topic belongs to the held-out split (stable hash)."""
    digest = hashlib.sha256((_TOPIC_SALT + topic).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def _prompt(rng: random.Random, user: str) -> str:
    return _CHAT.format(u=user) if rng.random() < 0.5 else user


def _wrong_number(rng: random.Random, p: Problem) -> int:
    """A plausible wrong answer: the careless one when there is one, else off by a bit."""
    mistake = mistake_for(p)
    if mistake is not None and rng.random() < 0.6:
        return solve(p, mistake)
    delta = rng.choice([-10, -2, -1, 1, 2, 10])
    return p.answer + delta


def _arith_rejected(rng: random.Random, p: Problem, family: str) -> str:
    right = worked_solution(p)
    steps = right.rsplit(" \\boxed", 1)[0]
    if family == "arith_careless":
        mistake = mistake_for(p)
        assert mistake is not None
        return worked_solution(p, mistake)
    if family == "arith_blurt":
        return f"\\boxed{{{_wrong_number(rng, p)}}}"
    if family == "arith_unboxed":
        return rng.choice([steps, f"{steps} The answer is {p.answer}.", str(p.answer)])
    if family == "arith_wrong_box":
        return f"{steps} \\boxed{{{_wrong_number(rng, p)}}}"
    filler = " ".join(rng.choice(_FILLER) for _ in range(rng.randint(2, 5)))
    return filler if rng.random() < 0.5 else f"{filler} \\boxed{{{p.answer}}}"


def arith_pair(rng: random.Random, p: Problem) -> PreferencePair:
    """A preference pair for problem ``p``; the family is drawn from ``rng``."""
    families = list(ARITH_FAMILIES)
    if mistake_for(p) is None:
        families.remove("arith_careless")
    elif rng.random() < 0.4:  # the hardest family (same format, wrong steps): seen more often
        families = ["arith_careless"]
    family = rng.choice(families)
    rejected = _arith_rejected(rng, p, family)
    return PreferencePair(_prompt(rng, p.prompt), worked_solution(p), rejected, family)


def help_pair(rng: random.Random, topic: str, others: list[str]) -> PreferencePair:
    """A helpfulness pair about ``topic``; off-topic answers use a topic from ``others``."""
    prompt = _prompt(rng, rng.choice(_HELP_PROMPTS).format(t=topic))
    chosen = rng.choice(_HELP_ANSWERS).format(t=topic)
    family = rng.choice(HELP_FAMILIES)
    if family == "help_offtopic":
        other = rng.choice([t for t in others if t != topic])
        rejected = rng.choice(_HELP_ANSWERS).format(t=other)
    elif family == "help_refusal":
        rejected = rng.choice(_REFUSALS)
    else:
        rejected = " ".join([topic] * rng.randint(4, 12))
    return PreferencePair(prompt, chosen, rejected, family)


def make_pairs(n: int, *, heldout: bool, seed: int) -> list[PreferencePair]:
    """``n`` pairs from one split (``heldout`` or training), reproducible from ``seed``.

    About `ARITH_SHARE` of them are arithmetic (levels drawn uniformly from
    `LEVELS`), the rest helpfulness. Problems and topics may repeat; they never
    cross splits.
    """
    rng = random.Random(f"prefs:{seed}:{heldout}")
    topics = [t for t in TOPICS if topic_is_heldout(t) == heldout]
    pairs: list[PreferencePair] = []
    while len(pairs) < n:
        if rng.random() < ARITH_SHARE:
            level = rng.choice(LEVELS)
            problem = make_problem(rng, level)
            while is_heldout(problem) != heldout:
                problem = make_problem(rng, level)
            pairs.append(arith_pair(rng, problem))
        else:
            pairs.append(help_pair(rng, rng.choice(topics), topics))
    return pairs
