"""Health guardrails: per-step checks on a run's metrics, each with an action.

`HealthMonitor.check(step, metrics)` looks at one step's metrics (the dict the
orchestrator writes to ``metrics.jsonl``) and returns the alerts that fired.
Each check has a threshold and an action from its `HealthCheck` config:

- ``warn``: log the alert (``events.jsonl`` and the progress display);
- ``stop``: also checkpoint and stop the run after this step;
- ``skip``: also undo this step's update (weights and optimizer state go back
  to where the step started, and the engine keeps the old weights); the run
  goes on with the next step. ``reward_hacking`` fires after evals, not on a
  step, so ``skip`` acts like ``warn`` there.

Checks (a missing metric skips its check):

- ``nan``: loss or grad norm is NaN/Inf. The trainer never applies a
  non-finite update, so the weights are still sound when this fires.
- ``entropy_collapse``: mean token entropy below ``threshold``.
- ``kl_blowup``: KL to the reference above ``threshold``.
- ``length_explosion``: mean response length above ``threshold`` times its
  mean over the first ``warmup`` steps.
- ``mismatch``: mean |trainer logprob - engine logprob| on sampled tokens above
  ``threshold`` (train/inference mismatch).
- ``throughput``: generation tokens/s below ``threshold`` times its moving
  average over the last ``window`` steps, for ``throughput_steps`` steps in a
  row (a slow step or two on a shared machine is noise, not an alert; slow
  steps are kept out of the average they are compared with). Once per
  sustained drop: it fires again only after the rate came back above halfway
  between the threshold and the average.
- ``reward_hacking``: `observe_eval` is fed held-out accuracy; fires when the
  train reward rose by more than ``threshold`` since the previous eval while
  held-out accuracy stayed flat or fell.

Checks that a run is learning at all (`check_learning`, on the whole step's
metrics; action ``stop`` by default, so a run that cannot learn ends with a
reason and a non-zero exit code instead of "succeeding" while training nothing):

- ``reward_errors``: the share of a step's samples whose reward failed (the
  reward raised, or gave NaN, inf, None or a non-number) above ``threshold``.
- ``episode_errors``: the share of a step's episodes that ended in an error of
  their own (``env/env_errors``: the env or the agent raised, hung or returned a
  bad reward; not the infrastructure's, which ``infra_errors`` counts) above
  ``threshold``.
- ``all_groups_dropped``: every group of the step was dropped (each sample of
  a group got the same reward, or too few samples were left) for ``threshold``
  steps in a row, or in every step of a run shorter than that.
- ``no_update``: no policy update for ``threshold`` steps in a row, or in any
  step of a run shorter than that (not checked with mode = "rollout_only"; a
  PPO critic warm-up step, which trains the critic alone, counts as an update).

It does not change the update itself; the orchestrator carries out actions.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from temper.config.health import Action, HealthCheck, HealthConfig


@dataclass
class Alert:
    step: int
    kind: str
    message: str
    action: Action
    value: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": "alert", "check": self.kind, "message": self.message,
                "action": self.action, "value": self.value}  # fmt: skip


class HealthMonitor:
    """Runs the checks of `HealthConfig` step by step (keeps the baselines it needs)."""

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.checks = {k: c for k, c in dict(cfg).items() if isinstance(c, HealthCheck)}
        #: Some per-step check may undo an update: the orchestrator snapshots before each.
        self.may_skip = any(c.enabled and c.action == "skip" for c in self.checks.values())
        self._lengths: list[float] = []
        self._throughput: deque[float] = deque(maxlen=cfg.window)
        self._low_streak = 0  # steps in a row below the line; reset once the rate recovers
        self._reward_at_eval: float | None = None
        self._accuracy_at_eval: float | None = None
        self._last_reward: float | None = None
        self._steps_seen = 0
        self._dropped_streak = 0
        self._no_update_streak = 0

    def _fire(self, out: list[Alert], step: int, kind: str, value: float, message: str) -> None:
        check = self.checks[kind]
        if check.enabled:
            out.append(Alert(step, kind, message, check.action, value))

    def check(self, step: int, m: dict[str, Any]) -> list[Alert]:
        """The alerts that fire on step ``step``'s metrics ``m``."""
        out: list[Alert] = []
        c = self.cfg
        for key in ("loss", "grad_norm"):
            if key in m and not math.isfinite(float(m[key])):
                self._fire(out, step, "nan", float(m[key]), f"{key} is {m[key]}")
                break
        if "entropy" in m and m["entropy"] < c.entropy_collapse.threshold:
            self._fire(out, step, "entropy_collapse", m["entropy"],
                       f"entropy {m['entropy']:.4g} < {c.entropy_collapse.threshold:g}")  # fmt: skip
        if "kl" in m and m["kl"] > c.kl_blowup.threshold:
            self._fire(
                out, step, "kl_blowup", m["kl"], f"KL {m['kl']:.4g} > {c.kl_blowup.threshold:g}"
            )
        mismatch = m.get("train_infer_logprob_diff")
        if mismatch is not None and mismatch > c.mismatch.threshold:
            self._fire(out, step, "mismatch", mismatch,
                       f"train/inference logprob diff {mismatch:.3g} > {c.mismatch.threshold:g}")  # fmt: skip
        episodes, infra = m.get("env/episodes"), m.get("env/finish/infra_error", 0.0)
        if episodes and infra / episodes > c.infra_errors.threshold:
            self._fire(out, step, "infra_errors", infra / episodes,
                       f"{infra:g} of {episodes:g} episodes failed for the infrastructure "
                       f"(> {c.infra_errors.threshold:g}); check the env servers")  # fmt: skip
        self._check_length(out, step, m)
        self._check_throughput(out, step, m)
        if "reward_mean" in m:
            self._last_reward = float(m["reward_mean"])
            if self._reward_at_eval is None and self._accuracy_at_eval is not None:
                self._reward_at_eval = self._last_reward  # the eval ran before any training
        return out

    def _check_length(self, out: list[Alert], step: int, m: dict[str, Any]) -> None:
        length = m.get("response_len_mean")
        if length is None:
            return
        if len(self._lengths) < self.cfg.warmup:
            self._lengths.append(float(length))
            return
        base = sum(self._lengths) / len(self._lengths)
        limit = self.cfg.length_explosion.threshold * base
        if base > 0 and length > limit:
            self._fire(out, step, "length_explosion", length,
                       f"mean response length {length:.1f} > {limit:.1f} ({self.cfg.length_explosion.threshold:g}x the first steps)")  # fmt: skip

    def _check_throughput(self, out: list[Alert], step: int, m: dict[str, Any]) -> None:
        rate = m.get("gen_tokens_per_s")
        if rate is None:
            return
        if len(self._throughput) < self._throughput.maxlen:
            self._throughput.append(float(rate))
            return
        avg = sum(self._throughput) / len(self._throughput)
        low, steps = self.cfg.throughput.threshold, self.cfg.throughput_steps
        if rate < low * avg:
            # Fires when the drop has lasted `steps` steps, once; a slow step does not
            # drag down the average it is measured against.
            self._low_streak += 1
            if self._low_streak == steps:
                self._fire(out, step, "throughput", rate,
                           f"generation {rate:.0f} tok/s < {low:g}x the moving average "
                           f"{avg:.0f} for {steps} step(s) in a row")  # fmt: skip
            return
        # Before it fired, any step above the line ends the streak; after, only a rate
        # back above the midpoint between the threshold and the average re-arms it.
        if self._low_streak < steps or rate >= (low + 1) / 2 * avg:
            self._low_streak = 0
        self._throughput.append(float(rate))

    def check_learning(
        self, step: int, m: dict[str, Any], *, last: bool = False, trains: bool = True
    ) -> list[Alert]:
        """The learning checks on one whole step's metrics ``m``.

        ``last``: this is the run's final step (the checks then also fire when no
        step of the run learned). ``trains``: the run updates the policy at all
        (False for mode = "rollout_only": ``no_update`` is not checked).
        """
        out: list[Alert] = []
        c = self.cfg
        self._steps_seen += 1
        samples, errors = m.get("samples", 0), m.get("reward_errors", 0)
        if samples and errors / samples > c.reward_errors.threshold:
            self._fire(out, step, "reward_errors", errors / samples,
                       f"the reward failed on {errors:g} of {samples:g} samples "
                       f"(> {c.reward_errors.threshold:.0%}); see the reward errors above")  # fmt: skip
        episodes, failed = m.get("env/episodes", 0), m.get("env/env_errors", 0)
        if episodes and failed / episodes > c.episode_errors.threshold:
            self._fire(out, step, "episode_errors", failed / episodes,
                       f"{failed:g} of {episodes:g} episodes ended in an error of their own "
                       f"(> {c.episode_errors.threshold:.0%}); see the episode errors above")  # fmt: skip
        groups = m.get("groups_kept", 0) + m.get("groups_dropped", 0)
        all_dropped = bool(groups) and m.get("groups_kept", 0) == 0
        self._dropped_streak = self._dropped_streak + 1 if all_dropped else 0
        if self._streak_fires(self._dropped_streak, c.all_groups_dropped, last):
            self._fire(out, step, "all_groups_dropped", self._dropped_streak,
                       f"every group was dropped in the last {self._dropped_streak} step(s): each "
                       "group's samples got the same reward (or too few were scored), so there "
                       "is no learning signal")  # fmt: skip
            return out
        # A critic warm-up step (PPO) trains the critic alone, on purpose.
        trained = "loss" in m or m.get("critic_warmup", 0.0) > 0
        updated = trained and not m.get("update_skipped")
        self._no_update_streak = 0 if updated else self._no_update_streak + 1
        if trains and self._streak_fires(self._no_update_streak, c.no_update, last):
            self._fire(out, step, "no_update", self._no_update_streak,
                       f"no policy update in the last {self._no_update_streak} step(s)")  # fmt: skip
        return out

    def _streak_fires(self, streak: int, check: HealthCheck, last: bool) -> bool:
        """A streak just reached the threshold, or covers the whole run at its last step.

        Fires once per streak, so a ``warn`` action logs it once, not every step.
        """
        return streak == max(1, int(check.threshold)) or (last and streak == self._steps_seen)

    def observe_eval(self, step: int, accuracy: float) -> list[Alert]:
        """Feed a held-out accuracy; may fire ``reward_hacking``."""
        out: list[Alert] = []
        reward = self._last_reward
        if (
            reward is not None
            and self._reward_at_eval is not None
            and self._accuracy_at_eval is not None
            and reward - self._reward_at_eval > self.cfg.reward_hacking.threshold
            and accuracy <= self._accuracy_at_eval
        ):
            self._fire(out, step, "reward_hacking", reward - self._reward_at_eval,
                       f"train reward rose {reward - self._reward_at_eval:+.3f} since the last eval "
                       f"while held-out accuracy went {self._accuracy_at_eval:.3f} -> {accuracy:.3f}")  # fmt: skip
        self._reward_at_eval, self._accuracy_at_eval = reward, accuracy
        return out
