"""The synchronous RL loop.

Each step: sample prompts → generate a group per prompt → score → advantages →
update the policy → publish the new weights to the engine as version step.
Evaluates at the start, every `eval.every` steps and at the end; checkpoints
atomically; writes metrics, sampled trajectories and the report into the run
directory. A resumed synchronous run continues exactly where the checkpoint
left off (an async one loses the groups in flight: docs/async.md).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import torch

from temper import compute
from temper.config import Config
from temper.data.task_sampling import LearnsFromResults
from temper.engine.base import SamplingParams
from temper.errors import ConfigError
from temper.eval.harness import evaluate
from temper.models import load_model, load_tokenizer, resolve_model_path
from temper.monitor.external_sinks import build_sinks
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
from temper.orchestrator.backend import publish_weights
from temper.orchestrator.build import build_run_tasks, build_vision
from temper.orchestrator.placement import build_backend
from temper.orchestrator.refill import assign_advantages, step_groups
from temper.orchestrator.run_dir import RunDir, load_recorded_groups
from temper.orchestrator.run_guard import (
    RunGuard,
    check_can_learn,
    check_log_config,
    check_reward_functions,
)
from temper.orchestrator.self_improve import build_self_improve
from temper.orchestrator.stage_model import format_plan
from temper.orchestrator.step_metrics import (
    rollout_metrics,
    rollout_seconds,
    stage_times,
    staleness_metrics,
)
from temper.rollout.multi_turn import episode_stats
from temper.rollout.single_turn import check_prompt_fits
from temper.rollout.sources import Groups
from temper.rollout.trajectory import Trajectory
from temper.trainer.checkpoint import (
    load_checkpoint_state,
    restore_trainer,
    save_checkpoint,
    set_rng_state,
)
from temper.trainer.distributed import build_trainer


class SyncOrchestrator:
    """Owns one run: its components, its loop and its run directory."""

    def __init__(self, cfg: Config) -> None:
        if cfg.engine.type == "openai" and cfg.orchestrator.mode != "rollout_only":
            # A remote endpoint cannot load our weights: refuse before loading anything.
            raise ConfigError(
                "engine.type = 'openai' cannot train (the endpoint takes no weight updates); "
                "use it with temper eval or orchestrator.mode = 'rollout_only'"
            )
        self.cfg = cfg
        check_log_config(cfg)
        check_can_learn(cfg)
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
        model_path = str(resolve_model_path(cfg.model.path))
        ckpts = [self.run_dir.resume_from] if self.run_dir.resume_from else []
        if ckpts:
            model_path = str(ckpts[-1])
        torch.manual_seed(cfg.run.seed)
        self.tokenizer = load_tokenizer(model_path)
        vision = build_vision(cfg)
        # What a checkpoint saves beside the weights: the tokenizer, or a VLM's whole
        # processor (tokenizer, image processor, chat template) so it loads as a VLM.
        self.model_files = vision.processor if vision is not None else self.tokenizer
        self.model = load_model(model_path, dtype=torch.float32)
        pad = self.tokenizer.pad_token_id
        # world_size > 1: FSDP2 ranks in child processes (temper.trainer.distributed).
        self.trainer = build_trainer(cfg, self.model, model_path, pad if pad is not None else 0)
        # Engines (local, or in rollout workers) and the transport their weights take.
        tasks = None
        if cfg.orchestrator.backend in ("process", "ray"):
            # The workers write their pid files into the run directory, so it is made
            # before they start: check the data and reward functions here first.
            tasks = build_run_tasks(cfg)
            check_reward_functions(cfg, [*tasks[1], *getattr(tasks[0], "tasks", [])])
            self.run_dir.create(cfg)
        self.backend = build_backend(cfg, model_path, self.tokenizer, self.run_dir.path, tasks)
        self.rollouts = self.backend.rollouts
        self.sampler, self.eval_tasks = self.rollouts.train, self.rollouts.heldout
        self._check_prompts_fit()
        check_reward_functions(cfg, [*self.eval_tasks, *getattr(self.sampler, "tasks", [])])
        # trainer.mode = "sft" / "rft": the steps are run there (None: RL steps, here).
        self.self_improve = build_self_improve(cfg, self.trainer, self.backend, self.tokenizer)
        if HealthMonitor(cfg.health).may_skip and getattr(self.trainer, "snapshot", None) is None:
            raise ConfigError("health checks with action 'skip' need trainer.world_size = 1")
        self.run_dir.create(cfg)  # replaces an old run (overwrite) only now
        if ckpts:
            compute.run(self._restore, ckpts[-1])
        sinks = build_sinks(
            cfg.log, self.run_dir.path, cfg.run.name, cfg.model_dump(mode="json"), self.start_step
        )
        self.metrics = FanOutSink(JsonlSink(self.run_dir.metrics), sinks)
        self.events = JsonlSink(self.run_dir.events)
        self.health = HealthMonitor(cfg.health)
        self.guard = RunGuard(cfg, self.health, self.events)
        self._last_trajs: list[Trajectory] = []
        self._checkpointed = -1
        self.async_rollouts: AsyncRollouts | None = None
        self._step_alerts: list[Alert] | None = None
        # What each step records as placement/*; "auto" changes it (temper.orchestrator.
        # auto_placement), "fixed" keeps the configured one.
        self.placement = fixed_placement(cfg, compute.get_threads())
        self.placer = None
        if cfg.orchestrator.placement == "auto":
            self.placer = AutoPlacement(cfg, self.backend, self.run_dir.metrics)

    def _check_prompts_fit(self) -> None:
        """Fail before any work if a dataset prompt cannot fit in the context.

        Env runs are checked per episode instead (the env renders the first prompt).
        """
        renderer = self.rollouts.renderer
        if renderer is None:
            return
        tasks = list(self.eval_tasks)
        tasks += getattr(self.sampler, "tasks", [])
        for task in tasks:
            ids, _ = renderer.render(task)
            check_prompt_fits(task, ids, self.backend.max_context)

    def _restore(self, ckpt: Path) -> None:
        state, trainer_state, rng = load_checkpoint_state(ckpt)
        restore_trainer(self.trainer, trainer_state, ckpt)  # any world size wrote it
        self.sampler.load_state_dict(state["sampler"])
        if self.self_improve is not None:
            self.self_improve.load_state_dict(state)
        set_rng_state(rng)
        self.start_step = int(state["step"])
        self.backend.version = int(state["version"])
        truncate_jsonl_after_step(self.run_dir.metrics, self.start_step)
        truncate_jsonl_after_step(self.run_dir.events, self.start_step)
        self.run_dir.drop_after(self.start_step)

    def _sampling(self) -> SamplingParams:
        o = self.cfg.orchestrator
        return SamplingParams(
            n=o.group_size,
            temperature=o.temperature,
            top_p=o.top_p,
            top_k=o.top_k,
            max_new_tokens=o.max_response_tokens,
        )

    async def evaluate(self, step: int) -> dict[str, Any]:
        e = self.cfg.eval
        tasks = self.eval_tasks[: e.size] if e.size else self.eval_tasks
        t0 = time.perf_counter()
        result = await evaluate(
            self.rollouts.source,
            tasks,
            k=e.k,
            temperature=e.temperature,
            max_new_tokens=e.max_response_tokens or self.cfg.orchestrator.max_response_tokens,
            seed=self.cfg.run.seed + 7919,
        )
        result["time_s"] = time.perf_counter() - t0  # the eval stage (temper plan reads it)
        self.run_dir.write_eval(step, result)
        scalars = {f"eval/{k}": v for k, v in numeric_scalars(result).items()}
        self.metrics.write_extras({"step": step, **scalars})
        return result

    async def train_step(self, step: int) -> dict[str, Any]:
        if self.self_improve is not None:  # trainer.mode = "sft" / "rft"
            m, self._last_trajs = await self.self_improve.step(step)
            self._write_samples(step, self._last_trajs, int(m.get("reward_errors", 0)))
            return m
        cfg = self.cfg
        t0 = time.perf_counter()
        version_before = self.backend.version
        mode = cfg.orchestrator.mode
        groups, generated, rollout_stats, extra = await self._collect_groups(step)
        flat = [t for g in generated for t in g]
        if isinstance(self.sampler, LearnsFromResults) and mode != "train_only":
            self.sampler.observe(step, flat)  # every group, zero-variance ones too
            extra |= self.sampler.metrics()
        self._last_trajs = flat
        failures = int(rollout_stats["reward_errors"])
        t2 = time.perf_counter()
        # Async: the engine keeps generating while the trainer steps, so it keeps its cache.
        asleep = False
        if not self.async_rollouts:
            if self.backend.abilities.sleep and cfg.engine.sleep:
                self.backend.sleep()  # colocated on a GPU: weights and cache freed
                asleep = True
            elif self.backend.abilities.release_memory and cfg.engine.release_memory_during_train:
                self.backend.release_memory()
        kept, dropped = assign_advantages(
            groups,
            cfg.algo.advantage,
            cfg.orchestrator.drop_zero_variance_groups,
            cfg.algo.credit,
            cfg.algo.turn_discount,
        )
        train = bool(kept) and mode != "rollout_only"
        snapshot = None
        if train and self.health.may_skip:  # a "skip" check may undo this update
            snapshot = await compute.arun(self.trainer.snapshot)
        with stage("train"):
            train_stats = await compute.arun(self.trainer.train_step, kept) if train else {}
        t3 = time.perf_counter()
        self._step_alerts = None
        if snapshot is not None:
            train = await self._check_before_publish(
                step, flat, train_stats, rollout_stats, snapshot
            )
        if asleep:
            self.backend.wake_up()
        if train:
            with stage("weight_sync"):
                publish_weights(self.backend, self.trainer.engine_state_dict(), step)
            if self.async_rollouts is not None:
                self.async_rollouts.weights_updated(step)
        t4 = time.perf_counter()
        m: dict[str, Any] = {"step": step, **rollout_metrics(flat), **train_stats}
        m.update(
            groups_kept=len(groups) - dropped,
            groups_dropped=len(generated) - len(groups) + dropped,
            samples=len(flat),
            reward_errors=failures,
            policy_version=self.backend.version,
            gen_tokens_per_s=m["tokens_generated"] / max(rollout_seconds(rollout_stats), 1e-9),
        )
        m.update(stage_times(rollout_stats, t0, t2, t3, t4))
        m.update(staleness_metrics(flat, version_before))
        m.update(extra)
        m.update(self._system_metrics(flat))
        self._write_samples(step, flat, failures)
        return m

    async def _collect_groups(self, step: int) -> tuple[Groups, Groups, dict, dict]:
        """This step's groups: (to train on, all generated, rollout stats, extra metrics),
        recorded (train_only), from the background (async) or generated now."""
        cfg = self.cfg
        if cfg.orchestrator.mode == "train_only":
            groups, stats = load_recorded_groups(cfg.orchestrator.train_from, step)
            return groups, groups, stats, {}
        if self.async_rollouts is not None:
            groups, stats = await self.async_rollouts.take(step)
            return groups, groups, stats, {}
        batch = await step_groups(
            self.rollouts.source,
            self.sampler,
            self._sampling(),
            prompts=cfg.orchestrator.prompts_per_step,
            seed=cfg.run.seed * 1_000_003 + step,
            refill=cfg.orchestrator.refill,
            max_rounds=cfg.orchestrator.max_refill_rounds,
        )
        return batch.train, batch.generated, batch.stats, batch.metrics

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
        if self.cfg.env.enabled:
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

    async def _check_before_publish(
        self,
        step: int,
        flat: list[Trajectory],
        train_stats: dict[str, Any],
        rollout_stats: dict[str, float],
        snapshot: dict,
    ) -> bool:
        """Run the health checks before the new weights go out; False if a "skip" undid them."""
        probe = {**rollout_metrics(flat), **train_stats}
        probe["gen_tokens_per_s"] = probe["tokens_generated"] / max(
            rollout_seconds(rollout_stats), 1e-9
        )
        self._step_alerts = self.health.check(step, probe)
        if not any(a.action == "skip" for a in self._step_alerts):
            return True
        await compute.arun(self.trainer.restore, snapshot)
        train_stats["update_skipped"] = 1.0
        return False

    def checkpoint(self, step: int) -> None:
        if self._checkpointed == step:
            return
        self._checkpointed = step
        compute.run(
            save_checkpoint,
            self.run_dir.checkpoints,
            step,
            self.model,
            self.model_files,
            self.trainer.state_dict(),
            {
                "version": self.backend.version,
                "sampler": self.sampler.state_dict(),
                **(self.self_improve.state_dict() if self.self_improve is not None else {}),
            },
            keep=self.cfg.checkpoint.keep,
            write_extra=getattr(self.trainer, "write_sharded_state", None),
        )

    async def run(self) -> dict[str, Any]:
        """Train to `orchestrator.steps`; returns the final eval (or {})."""
        cfg = self.cfg
        steps = cfg.orchestrator.steps
        last_eval: dict[str, Any] = {}
        started = time.perf_counter()
        with RunProgress(
            steps, self.start_step, enabled=cfg.log.progress, every_s=cfg.log.progress_every_s
        ) as progress:
            self.guard.start(self.start_step, self.run_dir, progress)
            if cfg.eval.at_start and self.start_step == 0:
                # Said before it starts: on a slow engine (HF, a VLM) the first eval can
                # take minutes, and a run that prints nothing looks like one that hangs.
                n = min(len(self.eval_tasks), cfg.eval.size or len(self.eval_tasks))
                progress.log(
                    f"eval step 0: {n} held-out tasks (greedy, then {cfg.eval.k} samples each)..."
                )
                last_eval = await self.evaluate(0)
                progress.log(_eval_line(0, last_eval))
                self.health.observe_eval(0, last_eval.get("accuracy", 0.0))
            step = self.start_step
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
        write_report(self.run_dir.path)
        return last_eval

    def _start_async(self, max_staleness: int, first_step: int) -> None:
        """Make rollouts in the background from ``first_step`` on."""
        o = self.cfg.orchestrator
        self.async_rollouts = AsyncRollouts(
            self.rollouts.source,
            lambda: self.sampler.sample(1)[0],
            self._sampling(),
            prompts_per_step=o.prompts_per_step,
            max_staleness=max_staleness,
            interrupt=o.interrupt,
            seed=self.cfg.run.seed * 1_000_003 + (first_step - 1) * 100_000,
            version=lambda: self.backend.version,
        )
        self.async_rollouts.start(first_step)

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
            # Checked already (before publishing) when a check may skip the update.
            alerts = (
                self._step_alerts if self._step_alerts is not None else self.health.check(step, m)
            )
            alerts += self.guard.after_step(step, m, self._last_trajs, progress)
            if cfg.eval.every and step % cfg.eval.every == 0 and step != steps:
                last_eval = await self.evaluate(step)
                progress.log(_eval_line(step, last_eval))
                alerts += self.health.observe_eval(step, last_eval.get("accuracy", 0.0))
            if self._raise_alerts(alerts, step, progress):
                break
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
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
        close_trainer = getattr(self.trainer, "close", None)  # stops FSDP ranks, if any
        if close_trainer is not None:
            close_trainer()


def _eval_line(step: int, result: dict[str, Any]) -> str:
    parts = [f"eval step {step}:"]
    keys = ("accuracy", "pass@1", f"pass@{result.get('k')}", f"mean@{result.get('k')}")
    for key in dict.fromkeys(keys):  # k = 1: pass@1 once
        if key in result:
            parts.append(f"{key} {result[key]:.3f}")
    return "  ".join(parts)


__all__ = ["SyncOrchestrator", "assign_advantages"]
