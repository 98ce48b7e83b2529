"""temper.orchestrator: the training loop and its stages.

- `loop.py`: `Orchestrator`, one run: builds its parts (`temper.builder`), runs the
  steps, evals, health checks and checkpoints, writes the run directory;
- `rl_step.py`: `RLStep`, a step in five stages: collect, advantages, train,
  publish, metrics; `collect.py` (one synchronous step's groups, with DAPO refill),
  `advantages.py` (the advantage stage), `step_metrics.py` (what a step logs);
- `self_improve.py`: the sft and rft steps (`trainer.mode`); `dpo.py`: the dpo steps;
- `async_rollouts.py`: groups generated in the background within
  `orchestrator.max_staleness` (docs/async.md);
- `run_dir.py`: the run directory, opened in two steps so a failed start loses
  nothing; `run_guard.py`: refusals at start, reward-error reports, Ctrl-C;
  `reward_check.py`: the reward tried on a few real samples before the step-0 eval;
  `teacher_eval.py`: a distillation teacher's held-out eval, once before step 0;
- `stage_model.py` + `auto_placement.py`: `temper plan` and
  ``orchestrator.placement = "auto"`` (docs/placement.md).
"""
