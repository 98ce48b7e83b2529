"""The `[distill]` config section: on-policy distillation, ``algo.advantage = "distill"``.

The student (the policy) samples; a frozen teacher scores the sampled tokens in one
forward; each sampled token's advantage is ``coef x (log p_teacher - log p_student)``,
the negative of the per-token reverse KL, plus ``reward_weight`` times the group's
task-reward advantage when the two are mixed (docs/algorithms.md, on-policy
distillation).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class DistillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    teacher: str | None = Field(
        None,
        description="The teacher: a model path or built-in alias, as --model.path takes (it "
        "runs in the trainer's process, frozen), or the http(s) URL of an OpenAI-compatible "
        "completions server that scores given tokens (echo = true, max_tokens = 0: temper "
        "serve, vLLM), which the orchestrator asks about each trajectory. It must share the "
        "student's tokenizer.",
    )
    teacher_model: str | None = Field(
        None, description="With a URL teacher: the model id to ask for; default the first listed."
    )
    teacher_timeout_s: float = Field(
        120.0, gt=0, description="With a URL teacher: seconds each scoring request may take."
    )
    coef: float = Field(
        1.0,
        gt=0,
        description="Scale of the per-token term log p_teacher - log p_student in the advantage.",
    )
    estimator: Literal["sampled", "full"] = Field(
        "sampled",
        description="sampled: each sampled token's advantage is coef x (log p_teacher - log "
        "p_student), one teacher logprob per token. full: the loss adds coef x the exact "
        "reverse KL at each sampled position, summed over the vocabulary from both models' "
        "logits (the same gradient in expectation, far less noise; the teacher's logits "
        "over the vocabulary per trained position). full needs a teacher in the trainer.",
    )
    reward_weight: float = Field(
        0.0,
        ge=0,
        description="Weight of the task reward's group advantage (GRPO's, reward minus group "
        "mean over group std) added to every sampled token; 0 = distillation alone.",
    )
    teacher_temperature: float = Field(
        1.0,
        gt=0,
        le=10,
        description="The teacher's logits are divided by this before it scores: below 1 the "
        "student learns a sharper distribution than the teacher's own (its greedy choice, "
        "more than its samples at temperature 1). A teacher in the trainer only: a served "
        "one returns each sampled token's logprob at temperature 1.",
    )
    teacher_eval: bool = Field(
        True,
        description="Evaluate the teacher on the held-out tasks once, before step 0 "
        "(eval/teacher.json; eval/teacher_* in metrics.jsonl), beside the student's evals.",
    )


def is_remote_teacher(teacher: str | None) -> bool:
    """Whether ``distill.teacher`` is a server's URL rather than a model path."""
    return bool(teacher) and str(teacher).startswith(("http://", "https://"))


def check_distill(cfg: Any) -> None:
    """Refuse a `[distill]` section without distillation, distillation without a teacher,
    and what it does not support yet (ValueError: exit 2). ``cfg`` is the whole run
    `Config`; whether the teacher loads and shares the tokenizer is checked when the
    trainer is built."""
    distilling = cfg.algo.advantage == "distill"
    if not distilling:
        # Changed from its default, not merely set: a dumped config holds every field.
        if cfg.distill != DistillConfig():
            raise ValueError(
                f"[distill] is set but algo.advantage = {cfg.algo.advantage!r}: set "
                "algo.advantage = 'distill' to distill from distill.teacher, or remove [distill]"
            )
        return
    if not cfg.distill.teacher:
        raise ValueError(
            "algo.advantage = 'distill' needs distill.teacher: a model path or built-in alias"
        )
    if cfg.trainer.mode != "rl":
        raise ValueError(
            f"algo.advantage = 'distill' is an RL advantage; trainer.mode = "
            f"{cfg.trainer.mode!r} does not use it (use trainer.mode = 'rl')"
        )
    if cfg.distill.teacher_temperature != 1.0 and is_remote_teacher(cfg.distill.teacher):
        raise ValueError(
            f"distill.teacher_temperature = {cfg.distill.teacher_temperature:g} needs a teacher "
            "in the trainer (a model path): a served teacher returns each sampled token's "
            "logprob at temperature 1 only"
        )
    if cfg.distill.estimator == "full" and is_remote_teacher(cfg.distill.teacher):
        raise ValueError(
            "distill.estimator = 'full' needs a teacher in the trainer (a model path): a "
            "served teacher returns the sampled tokens' logprobs, not its logits"
        )
    if cfg.distill.estimator == "full" and (cfg.trainer.loss_parallel or cfg.trainer.pp > 1):
        raise ValueError(
            "distill.estimator = 'full' compares whole-vocabulary logits on one rank: it "
            "runs without trainer.loss_parallel and with trainer.pp = 1 (use 'sampled')"
        )
    if cfg.distill.teacher_model and not is_remote_teacher(cfg.distill.teacher):
        raise ValueError(
            "distill.teacher_model names the model of a URL teacher; distill.teacher "
            f"{cfg.distill.teacher!r} is a model path"
        )
    if cfg.algo.credit == "turn":
        raise ValueError(
            "algo.advantage = 'distill' gives every sampled token its own advantage already; "
            "algo.credit = 'turn' has nothing to spread (use algo.credit = 'outcome')"
        )
    if cfg.orchestrator.refill:
        raise ValueError(
            "orchestrator.refill replaces groups of equal rewards, which GRPO cannot learn "
            "from; with algo.advantage = 'distill' the teacher scores every token and every "
            "group trains: set orchestrator.refill = false"
        )
