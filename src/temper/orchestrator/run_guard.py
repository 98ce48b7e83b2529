"""What keeps a run from training nothing in silence, or from losing work.

- `check_can_learn`: refuse at start a config that cannot produce a single
  update (a group-baseline advantage with groups of one), or an advantage
  estimator turn-level credit has no per-turn form of.
- `ErrorReport`: print each kind of reward error, and of an episode's own error
  (an env or agent that raised, hung or returned a bad value), once, with its
  sample, and count them all.
- `InterruptFlag`: the first Ctrl-C asks the run to stop after the current
  step (and write a checkpoint); a second one stops at once.

The orchestrator calls these; the learning health checks themselves
(`no_update`, `reward_errors`, `episode_errors`, `all_groups_dropped`) are in
`temper.monitor.health`.
"""

from __future__ import annotations

import re
import signal
import sys
from collections import Counter
from typing import Any

from temper.algos.turn_credit import TURN_ESTIMATORS
from temper.config import Config
from temper.errors import ConfigError
from temper.monitor.external_sinks import check_sinks
from temper.monitor.health import Alert, HealthMonitor
from temper.monitor.progress import RunProgress
from temper.monitor.sinks import JsonlSink
from temper.orchestrator.run_dir import RunDir
from temper.records import Trajectory
from temper.rewards.base import TRAINER_STATE


def check_can_learn(cfg: Config) -> None:
    """Refuse a config that cannot update the policy once (ConfigError, before any work)."""
    o = cfg.orchestrator
    if not cfg.engine.local and o.mode != "rollout_only":
        # A remote endpoint cannot load our weights: refuse before loading anything.
        raise ConfigError(
            f"engine.type = {cfg.engine.type!r} cannot train (the endpoint takes no weight "
            "updates); use it with temper eval or orchestrator.mode = 'rollout_only'"
        )
    # sft/rft train on likelihood, not on comparisons within a group.
    # gae: the critic is the baseline; distill: the teacher scores each token.
    group_baseline = cfg.algo.advantage not in ("gae", "distill")
    if (
        o.mode != "rollout_only"
        and o.group_size < 2
        and cfg.trainer.mode == "rl"
        and group_baseline
    ):
        raise ConfigError(
            f"orchestrator.group_size = {o.group_size} cannot learn: algo.advantage = "
            f"{cfg.algo.advantage!r} compares each sample with the others of its group, so "
            "every group of one is dropped and the policy never updates; use group_size >= 2"
        )
    if cfg.algo.credit == "turn" and cfg.algo.advantage not in (*TURN_ESTIMATORS, "gae"):
        raise ConfigError(
            f"algo.credit = 'turn' has no per-turn form of algo.advantage = "
            f"{cfg.algo.advantage!r}; use one of {', '.join(TURN_ESTIMATORS)}"
        )


def error_kind(error: str) -> str:
    """What makes two reward errors "the same": the text less exception messages and numbers."""
    kind = re.sub(r"(raised [\w.]+): [^;]*", r"\1", error)
    return re.sub(r"\d+", "N", kind)


class ErrorReport:
    """Prints the first error of each kind and counts them all: reward errors
    (`Trajectory.reward_error`), or with ``episodes=True`` the episodes' own errors
    (`Trajectory.env_error`: the env or the agent raised, hung or returned a bad
    value; infrastructure failures have a check of their own)."""

    def __init__(self, episodes: bool = False) -> None:
        self.episodes = episodes
        self.label = "episode error" if episodes else "reward error"
        self.metric = "env/env_errors" if episodes else "reward_errors"
        self.counts: Counter[str] = Counter()

    def _error(self, traj: Trajectory) -> str | None:
        if not self.episodes:
            return traj.reward_error
        return None if traj.finish_reason == "infra_error" else traj.env_error

    def see(self, step: int, trajs: list[Trajectory]) -> list[dict[str, Any]]:
        """Count ``trajs``' errors; return an event for each kind seen for the first time.

        ``sample`` is the trajectory's index in the step's batch.
        """
        first: list[dict[str, Any]] = []
        for index, traj in enumerate(trajs):
            error = self._error(traj)
            if error is None:
                continue
            kind = error_kind(error)
            if kind not in self.counts:
                first.append({"step": step, "kind": self.label.replace(" ", "_"),
                              "sample": index, "task_id": traj.task_id, "error": error})  # fmt: skip
            self.counts[kind] += 1
        return first

    def line(self, event: dict[str, Any]) -> str:
        return (
            f"{self.label} at step {event['step']}, sample {event['sample']} "
            f"(task {event['task_id']}): {event['error']} "
            f"[shown once; every error is counted in metrics.jsonl {self.metric}]"
        )

    def summary(self) -> str | None:
        if not self.counts:
            return None
        kinds = "; ".join(f"{n} x {kind}" for kind, n in self.counts.most_common(3))
        more = f" (+{len(self.counts) - 3} more kinds)" if len(self.counts) > 3 else ""
        return f"{self.label}s: {sum(self.counts.values())} in this run: {kinds}{more}"


def say(progress: RunProgress, message: str) -> None:
    """A console line, shown whether or not the progress bar is on."""
    if progress.enabled:
        progress.log(message)
    else:
        print(message, file=sys.stderr, flush=True)


class InterruptFlag:
    """While active, the first SIGINT sets ``requested``; a second raises KeyboardInterrupt.

    So Ctrl-C lets the step in progress finish and the run write a final
    checkpoint (whatever `checkpoint.every` says); Ctrl-C again quits at once.
    Does nothing outside the main thread (signals go to the main thread only).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> InterruptFlag:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "temper: interrupt: finishing this step and writing a checkpoint "
            "(Ctrl-C again to quit now)",
            file=sys.stderr,
            flush=True,
        )


class RunGuard:
    """The per-run state of the checks above: the orchestrator holds one.

    ``stop_reason`` is set when a health check stopped the run; ``interrupted_at``
    when Ctrl-C did (the step whose checkpoint was written).
    """

    def __init__(self, cfg: Config, health: HealthMonitor, events: JsonlSink) -> None:
        self.cfg, self.health, self.events = cfg, health, events
        self.reports = (ErrorReport(), ErrorReport(episodes=True))
        self.interrupt = InterruptFlag()
        self.stop_reason: str | None = None
        self.interrupted_at: int | None = None
        TRAINER_STATE.max_steps = cfg.orchestrator.steps

    def start(self, start_step: int, run_dir: RunDir, progress: RunProgress) -> None:
        """At the start of the loop: say (and record) that this run resumes, if it does."""
        TRAINER_STATE.global_step = start_step
        message = resume_message(run_dir, start_step, self.cfg)
        if message:
            say(progress, message)
            self.events.write({"step": start_step, "kind": "resumed",
                               "config_changes": run_dir.config_changes})  # fmt: skip

    def after_step(
        self, step: int, m: dict[str, Any], trajs: list[Trajectory], progress: RunProgress
    ) -> list[Alert]:
        """Report new kinds of reward and episode errors; return the learning checks'
        alerts."""
        TRAINER_STATE.global_step = step  # steps completed: what the next scoring sees
        for report in self.reports:
            for event in report.see(step, trajs):
                self.events.write(event)
                say(progress, report.line(event))
        trains = self.cfg.orchestrator.mode != "rollout_only"
        last = step == self.cfg.orchestrator.steps
        return self.health.check_learning(step, m, last=last, trains=trains)

    def stopped_by(self, alert: Alert) -> None:
        self.stop_reason = (
            f"run stopped at step {alert.step} by health check {alert.kind}: {alert.message}"
        )

    def finish(self, progress: RunProgress) -> None:
        for report in self.reports:
            summary = report.summary()
            if summary:
                say(progress, summary)


def resume_message(run_dir: RunDir, start_step: int, cfg: Config) -> str | None:
    """The line a resumed run prints (None for a fresh start)."""
    if run_dir.resume_from is None:
        return None
    text = f"resuming from step {start_step} ({run_dir.resume_from})"
    if run_dir.config_changes:
        changes = ", ".join(
            f"{k}: {old!r} -> {new!r}" for k, (old, new) in run_dir.config_changes.items()
        )
        text += (
            f"; config changed ({changes}), recorded in "
            f"config.resumed_step_{start_step}.toml beside config.toml"
        )
    if cfg.orchestrator.max_staleness:
        text += (
            "; async: groups that were in flight or buffered at the checkpoint are not "
            "kept, so the steps after it differ from an uninterrupted run's"
        )
    return text


def check_log_config(cfg: Config) -> None:
    """Fail before any work on a sink whose package is missing or an unreachable profile step."""
    check_sinks(cfg.log.sinks)
    profile_step = cfg.log.profile_step
    if profile_step is not None and profile_step > cfg.orchestrator.steps:
        raise ConfigError(
            f"log.profile_step={profile_step} is past the last step "
            f"(orchestrator.steps={cfg.orchestrator.steps})"
        )
