"""Online per-task statistics: pass rate, its uncertainty, times seen, last seen.

A *key* is what the statistics are kept for: a task id when the training set is
a finite list, a category (an arithmetic level, a visual kind) when tasks come
from a procedural generator, whose stream never repeats a task often enough to
learn anything about it.

Each key holds a Beta posterior over its pass rate: ``alpha = 1 + successes``,
``beta = 1 + failures`` (a uniform prior), where a success is a trajectory
whose ``correct`` flag is set. Pass rates drift while the policy learns, so
counts can be discounted: with ``decay`` d < 1, an observation made n steps
ago weighs d**n. The discount is applied lazily (when a key is read or
updated), so a step costs time in the keys it touches only, and a key that has
not been seen for a while drifts back towards the prior: its uncertainty grows
again, and a Thompson-sampling sampler explores it again.

Everything is plain numbers, so `state_dict` is JSON (the checkpoint's
state.json) and a resumed run reads back exactly the statistics it saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class KeyStats:
    """One key's counts, discounted to ``step`` (the last step it was updated)."""

    successes: float = 0.0
    failures: float = 0.0
    seen: int = 0  # trajectories observed, never discounted
    last_step: int = 0

    def at(self, step: int, decay: float) -> tuple[float, float]:
        """(successes, failures) discounted to ``step``."""
        weight = decay ** max(step - self.last_step, 0) if decay < 1.0 else 1.0
        return self.successes * weight, self.failures * weight


class TaskStats:
    """Beta-posterior pass rates per key, updated from scored trajectories."""

    def __init__(self, decay: float = 1.0) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.keys: dict[str, KeyStats] = {}

    def update(self, step: int, outcomes: list[tuple[str, bool]]) -> None:
        """Add ``(key, correct)`` outcomes observed at ``step``."""
        for key, correct in outcomes:
            st = self.keys.setdefault(key, KeyStats(last_step=step))
            st.successes, st.failures = st.at(step, self.decay)
            st.last_step = step
            st.seen += 1
            if correct:
                st.successes += 1.0
            else:
                st.failures += 1.0

    def posterior(self, key: str, step: int) -> tuple[float, float]:
        """(alpha, beta) of the key's Beta posterior at ``step``; (1, 1) when unseen."""
        st = self.keys.get(key)
        if st is None:
            return 1.0, 1.0
        s, f = st.at(step, self.decay)
        return 1.0 + s, 1.0 + f

    def pass_rate(self, key: str, step: int) -> float:
        """Posterior mean pass rate (0.5 when unseen)."""
        a, b = self.posterior(key, step)
        return a / (a + b)

    def stddev(self, key: str, step: int) -> float:
        """Posterior standard deviation of the pass rate (its uncertainty)."""
        a, b = self.posterior(key, step)
        return math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))

    def view(self, key: str, step: int) -> dict[str, Any]:
        """What a user weighting function sees of one key."""
        a, b = self.posterior(key, step)
        st = self.keys.get(key, KeyStats(last_step=-1))
        return {
            "key": key,
            "pass_rate": a / (a + b),
            "stddev": self.stddev(key, step),
            "alpha": a,
            "beta": b,
            "seen": st.seen,
            "last_step": st.last_step if st.seen else None,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "decay": self.decay,
            "keys": {
                k: [s.successes, s.failures, s.seen, s.last_step] for k, s in self.keys.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.keys = {
            k: KeyStats(float(s), float(f), int(n), int(last))
            for k, (s, f, n, last) in state["keys"].items()
        }
