"""Fault injection for testing reward pipelines (timeouts, crashes, errors).

These are module-level so they can be pickled into worker processes, e.g.
`MathVerifyReward(verify_fn=faulty_verify, timeout_s=1)`.
"""

from __future__ import annotations

import os
import time

from temper.rewards.math_verify_reward import verify_answer


def faulty_verify(gold: str, completion: str) -> bool:
    """`verify_answer`, unless the completion starts with a fault command.

    - `"SLEEP <seconds> ..."`: sleep that long, then verify the rest;
    - `"CRASH"`: the worker process exits at once with status 3;
    - `"RAISE"`: raise RuntimeError("injected failure").
    """
    if completion.startswith("SLEEP "):
        _, seconds, rest = [*completion.split(" ", 2), ""][:3]
        time.sleep(float(seconds))
        return verify_answer(gold, rest)
    if completion.startswith("CRASH"):
        os._exit(3)
    if completion.startswith("RAISE"):
        raise RuntimeError("injected failure")
    return verify_answer(gold, completion)
