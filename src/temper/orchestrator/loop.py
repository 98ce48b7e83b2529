"""The training loop: `Orchestrator` owns one run, synchronous or asynchronous.

It builds the run's parts through `temper.builder` (model, trainer, rollout backend,
tasks, sinks), then runs steps from ``start_step + 1`` to ``orchestrator.steps``:
each step is an `RLStep` (collect → advantages → train → publish → metrics,
`temper.orchestrator.rl_step`) or, with ``trainer.mode = "sft"``/``"rft"``, a
supervised step (`temper.orchestrator.self_improve`), or with ``"dpo"`` a
preference step (`temper.orchestrator.dpo`). Around the steps it evaluates
at the start, every ``eval.every`` steps and at the end, runs the health checks,
checkpoints atomically (`temper.trainer.checkpoint`), and writes the run
directory. A resumed synchronous run continues exactly where the checkpoint left
off (an async one loses the groups in flight: docs/async.md).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

from temper import compute
from temper.backends.base import RolloutBackend, publish_weights
from temper.builder.backends import build_backend
from temper.builder.model import load_run_model
from temper.builder.rewards import check_reward_functions
from temper.builder.sinks import build_sinks
from temper.builder.tasks import (
    RunTasks,
    build_preference_pairs,
    build_run_tasks,
    build_sft_rows,
)
from temper.builder.trainer import build_remote_teacher, build_trainer
from temper.config import Config
from temper.errors import ConfigError
from temper.eval.harness import CORRECT_RULES, evaluate
from temper.models import load_model
from temper.monitor.health import Alert, HealthMonitor
from temper.monitor.profile import profile_to, stage
from temper.monitor.progress import RunProgress
from temper.monitor.report import write_report
from temper.monitor.sinks import (
    FanOutSink,
    JsonlSink,
    numeric_scalars,
    truncate_jsonl_after_step,
)
from temper.orchestrator.async_rollouts import AsyncRollouts
from temper.orchestrator.auto_placement import (
    AutoPlacement,
    check_auto_placement,
    fixed_placement,
    placement_metrics,
)
from temper.orchestrator.dpo import DPOSteps, OnlineDPORounds
from temper.orchestrator.reward_check import check_reward_on_samples
from temper.orchestrator.rl_step import RLStep, StepResult, sampling_params
from temper.orchestrator.run_dir import RunDir
from temper.orchestrator.run_guard import (
    RunGuard,
    check_can_learn,
    check_log_config,
)
from temper.orchestrator.self_improve import RFTRounds, SFTSteps
from temper.orchestrator.stage_model import format_plan
from temper.orchestrator.teacher_eval import evaluate_teacher
from temper.records import Trajectory
from temper.rollout.multi_turn import episode_stats
from temper.rollout.single_turn import check_prompt_fits
from temper.trainer.checkpoint import (
    Cadence,
    best_checkpoint,
    load_checkpoint_state,
    mark_best,
    save_checkpoint,
    set_rng_state,
)

#: A step of any kind: `RLStep`, `SFTSteps`, `RFTRounds`, `DPOSteps` or `OnlineDPORounds`.
Steps = RLStep | SFTSteps | RFTRounds | DPOSteps | OnlineDPORounds


class Orchestrator:
    """Owns one run: its components, its loop and its run directory."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        check_can_learn(cfg)
        check_log_config(cfg)
        check_auto_placement(cfg)
        if cfg.run.threads:
            compute.set_threads(cfg.run.threads)
        # Looks only: the run directory is written once everything below checked out.
        self.run_dir = RunDir.open(cfg)
        try:
            self._build(cfg)
        except BaseException:
            self.run_dir.abandon()  # a failed start leaves nothing that blocks a retry
            raise

    def _build(self, cfg: Config) -> None:
        self.start_step = 0
        resume = self.run_dir.resume_from
        torch.manual_seed(cfg.run.seed)
        # A LoRA checkpoint holds the adapter, not a model: the run loads its base again.
        weights = str(resume) if resume and not cfg.lora.enabled else None
        self.model = load_run_model(cfg, weights, images=True)
        self.policy = load_model(self.model.weights, dtype=torch.float32)
        pad = self.model.tokenizer.pad_token_id
        # world_size > 1: FSDP2 ranks in child processes (temper.trainer.distributed).
        self.trainer = build_trainer(cfg, self.policy, self.model, pad if pad is not None else 0)
        tasks = build_run_tasks(cfg)
        if cfg.orchestrator.backend != "local":
            # The workers write their pid files into the run directory, so it is made
            # before they start: check the data and reward functions here first.
            check_reward_functions(cfg, [*tasks.heldout, *tasks.train.tasks])
            self.run_dir.create(cfg)
        self.backend: RolloutBackend = build_backend(cfg, self.model, tasks, self.run_dir.path)
        self.sampler, self.eval_tasks, self.tasks = tasks.train, tasks.heldout, tasks
        self.teacher_accuracy: float | None = None  # set by `_teacher_eval`
        self._check_prompts_fit(tasks)
        check_reward_functions(cfg, [*tasks.heldout, *tasks.train.tasks])
        self.health = HealthMonitor(cfg.health)
        self.steps = self._steps(cfg)
        if self.health.may_skip and not self.trainer.abilities.undo:
            raise ConfigError("health checks with action 'skip' need trainer.world_size = 1")
        self.run_dir.create(cfg)  # replaces an old run (overwrite) only now
        if resume:
            compute.run(self._restore, resume)
        sinks = build_sinks(
            cfg.log, self.run_dir.path, cfg.run.name, cfg.model_dump(mode="json"), self.start_step
        )
        self.metrics = FanOutSink(JsonlSink(self.run_dir.metrics), sinks)
        self.events = JsonlSink(self.run_dir.events)
        self.guard = RunGuard(cfg, self.health, self.events)
        self._last_trajs: list[Trajectory] = []
        self._checkpointed = -1
        self.cadence = Cadence(cfg.checkpoint.every, cfg.checkpoint.every_minutes)
        self.async_rollouts: AsyncRollouts | None = None
        # What each step records as placement/*; "auto" changes it (temper.orchestrator.
        # auto_placement), "fixed" keeps the configured one.
        self.placement = fixed_placement(cfg, compute.get_threads())
        self.placer = None
        if cfg.orchestrator.placement == "auto":
            self.placer = AutoPlacement(cfg, self.backend, self.run_dir.metrics)

    def _steps(self, cfg: Config) -> Steps:
        """The step of ``trainer.mode``: RL, supervised (sft), rejection sampling (rft) or
        preference pairs (dpo)."""
        if cfg.trainer.mode == "dpo":
            return self._dpo_steps(cfg)
        if cfg.trainer.mode == "rft":
            return RFTRounds(cfg, self.trainer, self.backend, self.sampler)
        if cfg.trainer.mode == "sft":
            if self.model.vision is not None:
                raise ConfigError("trainer.mode = 'sft' trains text models only so far")
            rows = build_sft_rows(cfg, self.model.tokenizer, self.backend.max_context)
            return SFTSteps(cfg, self.trainer, self.backend, rows)
        teacher = build_remote_teacher(cfg, self.model)  # distill.teacher = URL, or None
        return RLStep(
            cfg, self.trainer, self.backend, self.sampler, self.health, self._system_metrics,
            teacher=teacher,
        )  # fmt: skip

    def _dpo_steps(self, cfg: Config) -> DPOSteps | OnlineDPORounds:
        if self.model.vision is not None or not self.trainer.abilities.preference:
            raise ConfigError(
                "trainer.mode = 'dpo' trains text models only so far (at any world size)"
            )
        if cfg.dpo.pairs == "online":
            return OnlineDPORounds(cfg, self.trainer, self.backend, self.sampler)
        pairs = build_preference_pairs(cfg, self.model.tokenizer, self.backend.max_context)
        return DPOSteps(cfg, self.trainer, self.backend, *pairs)

    def _check_prompts_fit(self, tasks: RunTasks) -> None:
        """Fail before any work if a dataset prompt cannot fit in the context.

        Env runs are checked per episode instead (the env renders the first prompt).
        """
        renderer = self.backend.rollouts.renderer
        if renderer is None:
            return
        for task in [*tasks.heldout, *tasks.train.tasks]:
            ids, _ = renderer.render(task)
            check_prompt_fits(task, ids, self.backend.max_context)

    async def evaluate(self, step: int) -> dict[str, Any]:
        e = self.cfg.eval
        tasks = self.eval_tasks[: e.size] if e.size else self.eval_tasks
        t0 = time.perf_counter()
        result = await evaluate(
            self.backend.rollouts.source,
            tasks,
            k=e.k,
            temperature=e.temperature,
            max_new_tokens=e.max_response_tokens or self.cfg.orchestrator.max_response_tokens,
            seed=self.cfg.run.seed + 7919,
        )
        if isinstance(self.steps, DPOSteps):  # the held-out pairs' implicit-reward accuracy
            result.update(await self.steps.heldout_preference())
        if self.teacher_accuracy is not None:  # a distillation run: the teacher beside it
            result["teacher_accuracy"] = self.teacher_accuracy
        result["time_s"] = time.perf_counter() - t0  # the eval stage (temper plan reads it)
        self.run_dir.write_eval(step, result)
        scalars = {f"eval/{k}": v for k, v in numeric_scalars(result).items()}
        self.metrics.write_extras({"step": step, **scalars})
        return result

    async def train_step(self, step: int) -> dict[str, Any]:
        """One step of the run's kind; records its samples and reward errors."""
        m, self._last_trajs = await self.steps.step(step)
        self._write_samples(step, self._last_trajs, int(m.get("reward_errors", 0)))
        return m

    def _system_metrics(self, flat: list[Trajectory]) -> dict[str, Any]:
        """Placement, async, backend, memory and env metrics of the step."""
        m: dict[str, Any] = {}
        if self.placer is not None:
            p = self.placer
            m.update(placement_metrics(p.current, compute.cores(), p.worker_threads))
        else:
            m.update(placement_metrics(self.placement, compute.cores()))
        if self.async_rollouts is not None:
            m.update(self.async_rollouts.metrics())
        if self.backend.abilities.metrics:  # e.g. workers/* with rollout workers
            m.update(self.backend.metrics())
        m["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if self.cfg.env.enabled or self.cfg.agent.enabled:
            m.update({f"env/{k}": v for k, v in episode_stats(flat).items()})
        return m

    def _write_samples(self, step: int, flat: list[Trajectory], failures: int) -> None:
        """Record ``log.trajectories_per_step`` of the step's samples, and its reward errors."""
        n_keep = self.cfg.log.trajectories_per_step
        if n_keep:
            stride = max(1, len(flat) // n_keep)
            self.run_dir.write_trajectories(step, flat[::stride][:n_keep])
        if failures:
            self.events.write({"step": step, "kind": "reward_errors", "count": failures})

    def checkpoint(self, step: int) -> None:
        if self._checkpointed == step:
            return
        self._checkpointed = step
        self.cadence.restart()  # any checkpoint restarts the wall-time clock
        t = self.trainer
        # What a checkpoint saves beside the weights: the tokenizer, or a VLM's whole
        # processor (tokenizer, image processor, chat template) so it loads as a VLM.
        vision = self.model.vision
        compute.run(
            save_checkpoint,
            self.run_dir.checkpoints,
            step,
            t.saved_model(),  # the HF model, or with [lora] the adapter alone
            vision.processor if vision is not None else self.model.tokenizer,
            t.state_dict(),
            {
                "version": self.backend.version,
                "sampler": self.sampler.state_dict(),
                **self.steps.state_dict(),
            },
            keep=self.cfg.checkpoint.keep,
            write_extra=t.write_sharded_state if t.abilities.sharded_state else None,
        )

    def _keep_if_best(self, step: int, result: dict[str, Any], write: bool = True) -> None:
        """checkpoint.keep_best: checkpoint ``step`` (unless not ``write``) when its eval's
        held-out accuracy beats the best marked so far, and keep it beyond checkpoint.keep."""
        c, accuracy = self.cfg.checkpoint, result.get("accuracy")
        if not c.keep_best or accuracy is None or step == 0:
            return
        best = best_checkpoint(self.run_dir.checkpoints)  # a resumed run's best too
        if best is not None and accuracy <= best.get("accuracy", -1.0):
            return
        if write:
            self.checkpoint(step)
        if self._checkpointed == step:
            mark_best(self.run_dir.checkpoints, step, float(accuracy), c.keep)

    def _restore(self, ckpt: Path) -> None:
        state, trainer_state, rng = load_checkpoint_state(ckpt)
        self.trainer.load_checkpoint(ckpt, trainer_state)  # any world size wrote it
        self.sampler.load_state_dict(state["sampler"])
        self.steps.load_state_dict(state)
        set_rng_state(rng)
        self.start_step = int(state["step"])
        self.backend.version = int(state["version"])
        if self.trainer.abilities.adapter:  # the engines loaded the base: add the adapter
            publish_weights(self.backend, self.trainer.engine_state_dict(), self.backend.version)
        truncate_jsonl_after_step(self.run_dir.metrics, self.start_step)
        truncate_jsonl_after_step(self.run_dir.events, self.start_step)
        self.run_dir.drop_after(self.start_step)

    async def run(self) -> dict[str, Any]:
        """Train to `orchestrator.steps`; returns the final eval (or {})."""
        cfg = self.cfg
        last_eval: dict[str, Any] = {}
        started = time.perf_counter()
        with RunProgress(
            cfg.orchestrator.steps,
            self.start_step,
            enabled=cfg.log.progress,
            every_s=cfg.log.progress_every_s,
        ) as progress:
            self.guard.start(self.start_step, self.run_dir, progress)
            if self.trainer.abilities.adapter:  # else only the checkpoint files would say so
                progress.log(_lora_line(cfg, self.policy))
            if cfg.eval.at_start and self.start_step == 0:
                last_eval = await self._first_eval(progress)
            step = self.start_step
            self.cadence.restart()  # wall time counts training, not loading or the first eval
            if cfg.orchestrator.max_staleness:
                self._start_async(cfg.orchestrator.max_staleness, self.start_step + 1)
            try:
                with self.guard.interrupt:
                    step, mid_eval = await self._loop(progress, started)
                last_eval = mid_eval or last_eval
            finally:
                if self.async_rollouts is not None:
                    await self.async_rollouts.close()
            self.guard.finish(progress)
            if self.guard.interrupted_at is not None:
                return last_eval  # Ctrl-C: checkpointed in the loop; no final eval
            # Checkpoint first: a Ctrl-C during the final eval then loses no step.
            if cfg.checkpoint.at_end and step > self.start_step:
                self.checkpoint(step)
            if cfg.eval.at_end and step > self.start_step:
                last_eval = await self.evaluate(step)
                progress.log(_eval_line(step, last_eval))
                self._keep_if_best(step, last_eval, write=False)  # at_end wrote it, or not
        write_report(self.run_dir.path)
        return last_eval

    async def _first_eval(self, progress: RunProgress) -> dict[str, Any]:
        # A reward that fails on every sample stops the run here, not after the eval.
        if self.cfg.reward.check_samples:
            await check_reward_on_samples(
                self.cfg, self.backend.rollouts, self.model.tokenizer, self.events
            )
        # Said before it starts: on a slow engine (HF, a VLM) the first eval can take
        # minutes, and a run that prints nothing looks like one that hangs.
        n = min(len(self.eval_tasks), self.cfg.eval.size or len(self.eval_tasks))
        if self.cfg.algo.advantage == "distill" and self.cfg.distill.teacher_eval:
            await self._teacher_eval(progress, n)
        progress.log(
            f"eval step 0: {n} held-out tasks (greedy, then {self.cfg.eval.k} samples each)..."
        )
        result = await self.evaluate(0)
        progress.log(_eval_line(0, result))
        self.health.observe_eval(0, result.get("accuracy", 0.0))
        return result

    async def _teacher_eval(self, progress: RunProgress, n: int) -> None:
        """The teacher on the student's held-out tasks, once (`teacher_eval`)."""
        progress.log(f"teacher eval: {self.cfg.distill.teacher}, {n} held-out tasks...")
        result = await evaluate_teacher(self.cfg, self.tasks, self.eval_tasks[:n])
        self.teacher_accuracy = result["accuracy"]
        (self.run_dir.eval_dir / "teacher.json").write_text(json.dumps(result, indent=1))
        scalars = {f"eval/teacher_{k}": v for k, v in numeric_scalars(result).items()}
        self.metrics.write_extras({"step": 0, **scalars})
        progress.log(_eval_line(0, result).replace("eval step 0:", "teacher eval:"))

    def _start_async(self, max_staleness: int, first_step: int) -> None:
        """Make rollouts in the background from ``first_step`` on."""
        o = self.cfg.orchestrator
        self.async_rollouts = AsyncRollouts(
            self.backend.rollouts.source,
            lambda: self.sampler.sample(1)[0],
            sampling_params(self.cfg),
            prompts_per_step=o.prompts_per_step,
            max_staleness=max_staleness,
            interrupt=o.interrupt,
            seed=self.cfg.run.seed * 1_000_003 + (first_step - 1) * 100_000,
            version=lambda: self.backend.version,
        )
        self.async_rollouts.start(first_step)
        if isinstance(self.steps, RLStep):
            self.steps.async_rollouts = self.async_rollouts

    def _place(self, step: int, progress: RunProgress) -> None:
        """placement = "auto": this step's probe, or, once the warm-up is over, the plan."""
        placer = self.placer
        if placer is None or not placer.probing:
            return
        if step <= placer.warmup:
            placer.apply(placer.probe(step))
            return
        plan = placer.decide()  # a resumed run reads the same warm-up steps back
        if step == placer.warmup + 1:
            self.events.write({"step": step, "kind": "placement", "plan": plan.to_json()})
        progress.log(format_plan(plan))
        if plan.best.placement.max_staleness:
            self._start_async(plan.best.placement.max_staleness, step)

    async def _loop(self, progress: RunProgress, started: float) -> tuple[int, dict[str, Any]]:
        """Steps from `start_step` + 1 on; returns the last step run and the last eval."""
        cfg = self.cfg
        steps = cfg.orchestrator.steps
        last_eval: dict[str, Any] = {}
        step = self.start_step
        for step in range(self.start_step + 1, steps + 1):
            if self.guard.interrupt.requested:  # Ctrl-C before the first step
                self.guard.interrupted_at = step - 1
                break
            self._place(step, progress)
            m = await self._step(step, progress)
            self.metrics.write(m)
            progress.update(step, m)
            alerts = self._step_alerts(step, m)
            alerts += self.guard.after_step(step, m, self._last_trajs, progress)
            if cfg.eval.every and step % cfg.eval.every == 0 and step != steps:
                last_eval = await self.evaluate(step)
                progress.log(_eval_line(step, last_eval))
                alerts += self.health.observe_eval(step, last_eval.get("accuracy", 0.0))
                self._keep_if_best(step, last_eval)
            if self._raise_alerts(alerts, step, progress):
                break
            if self.cadence.due(step):  # checkpoint.every steps, or every_minutes
                self.checkpoint(step)
            if self.guard.interrupt.requested:  # Ctrl-C: stop here with a checkpoint
                self.checkpoint(step)
                self.guard.interrupted_at = step
                break
            budget = cfg.orchestrator.max_seconds
            if budget and time.perf_counter() - started > budget:
                self.events.write({"step": step, "kind": "time_budget_reached"})
                progress.log(f"time budget of {budget:.0f}s reached at step {step}")
                break
        return step, last_eval

    def _step_alerts(self, step: int, m: dict[str, Any]) -> list[Alert]:
        """The health checks of this step, unless the step ran them before publishing
        (a check that may skip the update)."""
        checked = self.steps.alerts if isinstance(self.steps, RLStep) else None
        return list(checked) if checked is not None else self.health.check(step, m)

    async def _step(self, step: int, progress: RunProgress) -> dict[str, Any]:
        """`train_step`, under torch.profiler when it is `log.profile_step`."""
        if step != self.cfg.log.profile_step:
            return await self.train_step(step)
        path = self.run_dir.path / "profile" / f"step_{step:06d}.trace.json"
        with profile_to(path) as all_threads, stage("step"):
            m = await self.train_step(step)
        self.events.write(
            {"step": step, "kind": "profile", "path": str(path), "all_threads": all_threads}
        )
        progress.log(f"profile of step {step}: {path} (open in https://ui.perfetto.dev)")
        return m

    def _raise_alerts(self, alerts: list[Alert], step: int, progress: RunProgress) -> bool:
        """Log ``alerts``; on a ``stop`` action checkpoint and return True (stop the run)."""
        for alert in alerts:
            self.events.write(alert.to_json())
            progress.log(f"[health] step {step}: {alert.kind}: {alert.message} ({alert.action})")
        stop = next((a for a in alerts if a.action == "stop"), None)
        if stop is None:
            return False
        self.checkpoint(step)
        self.guard.stopped_by(stop)
        self.events.write({"step": step, "kind": "stopped_by_health_check", "check": stop.kind,
                           "reason": self.guard.stop_reason})  # fmt: skip
        progress.log(f"stopped at step {step} by a health check; checkpoint written")
        return True

    async def close(self) -> None:
        self.metrics.close()
        self.events.close()
        await self.backend.close()
        self.trainer.close()  # stops FSDP ranks, if any


def _lora_line(cfg: Config, policy: torch.nn.Module) -> str:
    """The console line that says a run trains ``[lora]``'s adapters, how many and how fast."""
    adapter = sum(p.numel() for name, p in policy.named_parameters() if "lora_" in name)
    total = sum(p.numel() for p in policy.parameters())
    lr = cfg.trainer.lr * cfg.lora.lr_multiplier
    return (
        f"lora: rank {cfg.lora.rank}, {adapter:,} adapter weights train ({adapter / total:.2%} "
        f"of {total:,}), lr {lr:g} (trainer.lr x lora.lr_multiplier {cfg.lora.lr_multiplier:g})"
    )


def _eval_line(step: int, result: dict[str, Any]) -> str:
    """The console line of an eval: accuracy beside the mean reward, and a note when
    correctness is the default rule (no reward component declares one)."""
    parts = [f"eval step {step}:"]
    k = result.get("k")
    keys = ("accuracy", "reward_mean", "pass@1", f"pass@{k}", f"mean@{k}", f"reward_mean@{k}")
    for key in dict.fromkeys(keys):  # k = 1: pass@1 once
        if key in result:
            parts.append(f"{key} {result[key]:.3f}")
    if result.get("correct_rule") == CORRECT_RULES["default"]:
        parts.append("(correct: reward >= 1; no reward component declares correctness)")
    if result.get("episode_errors"):
        parts.append(
            f"({result['episode_errors']} of {result['episodes']} episodes ended in an "
            f"error; the first: {result['first_episode_error']})"
        )
    return "  ".join(parts)


__all__ = ["Orchestrator", "StepResult"]
