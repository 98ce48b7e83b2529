"""The run's trainer from `[trainer]`, `[algo]`, `[critic]` and `[lora]`: a `PolicyTrainer`
in this process at ``world_size = 1``, else a `DistributedTrainer` over spawned, launched
(torchrun, mpirun) or Ray ranks. With ``[lora]`` the policy gets peft's adapters first
(`build_lora`: a VLM's language model only; on every rank at world size > 1). With
``algo.advantage = "distill"`` it holds the frozen teacher too (`teacher_path`: the
student's tokenizer; on every rank)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from temper.builder.model import RunModel
from temper.config import Config
from temper.config.distill import is_remote_teacher
from temper.config.lora import LoraConfig
from temper.devices import resolve_device
from temper.errors import ConfigError, ModelLoadError
from temper.models import load_model
from temper.models.loader import is_vision_language, load_tokenizer
from temper.rollout.remote_teacher import RemoteTeacher
from temper.trainer.base import Trainer
from temper.trainer.critic import Critic
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.launch import check_world_size, detect_launch
from temper.trainer.policy_trainer import PolicyTrainer
from temper.vision.processor import pixel_source

if TYPE_CHECKING:  # imports peft: only a run with [lora] loads it
    from temper.trainer.lora import LoraAdapter


def build_trainer(cfg: Config, policy: torch.nn.Module, model: RunModel, pad_id: int) -> Trainer:
    """The trainer of ``policy`` (loaded from ``model.weights``). A KL reference is the
    configured base model (``model.base``) at any world size; so is online DPO's
    reference (dataset DPO caches its reference logprobs instead of a second model)."""
    online_dpo = cfg.trainer.mode == "dpo" and cfg.dpo.pairs == "online"
    ref_path = model.base if cfg.algo.uses_reference or online_dpo else None
    steps = cfg.orchestrator.steps
    lora, trainer_cfg = None, cfg.trainer
    if cfg.lora.enabled:
        lora = cfg.lora
        # The adapters' rate; a critic (built below, world size 1) keeps cfg.trainer.lr.
        trainer_cfg = cfg.trainer.model_copy(update={"lr": cfg.trainer.lr * lora.lr_multiplier})
    launch = detect_launch(master_addr=cfg.trainer.master_addr, master_port=cfg.trainer.master_port)
    if launch is not None:
        if launch.rank != 0:
            raise ConfigError(
                f"{launch.launcher} rank {launch.rank} reached the run itself: launched ranks "
                "other than 0 must run `temper train` (the CLI), which only trains there"
            )
        check_world_size(cfg.trainer.world_size, launch)
        trainer_cfg = trainer_cfg.model_copy(update={"world_size": launch.world_size})
        unsupported = model.vision is not None or cfg.algo.advantage == "gae"
        if unsupported or cfg.trainer.mode in ("sft", "rft"):
            raise ConfigError(
                f"{launch.launcher} with {launch.world_size} ranks: launched trainers run RL "
                "and DPO on text models without a critic so far (not a vision-language "
                "model, algo.advantage = 'gae', or trainer.mode = 'sft'/'rft')"
            )
        return DistributedTrainer(
            policy, model.weights, trainer_cfg, cfg.algo, steps, pad_id, ref_path=ref_path,
            launch=launch, distill=cfg.distill, teacher_path=teacher_path(cfg, model), lora=lora,
            dpo=cfg.dpo,
        )  # fmt: skip
    if cfg.trainer.world_size > 1:
        if model.vision is not None:
            raise ConfigError(
                "trainer.world_size > 1 trains text models only so far; a vision-language "
                "model trains at world_size = 1"
            )
        return DistributedTrainer(
            policy, model.weights, trainer_cfg, cfg.algo, steps, pad_id, ref_path=ref_path,
            distill=cfg.distill, teacher_path=teacher_path(cfg, model), lora=lora,
            dpo=cfg.dpo,
        )  # fmt: skip
    device = resolve_device(cfg.trainer.device, "trainer.device")
    policy.to(device)
    ref = load_model(ref_path, dtype=torch.float32).to(device) if ref_path else None
    pixels = None
    if model.vision is not None:
        assert model.images is not None  # a training run keeps its images
        pixels = pixel_source(model.vision, model.images)
    critic = build_critic(cfg, policy, device) if cfg.algo.advantage == "gae" else None
    path = teacher_path(cfg, model)
    teacher = load_model(path, dtype=torch.float32).to(device) if path else None
    adapter = build_lora(lora, policy) if lora is not None else None
    return PolicyTrainer(
        policy,
        trainer_cfg,
        cfg.algo,
        steps,
        pad_id=pad_id,
        ref_model=ref,
        pixels=pixels,
        critic=critic,
        adapter=adapter,
        dpo=cfg.dpo,
        teacher=teacher,
        distill=cfg.distill,
    )


def build_lora(lora: LoraConfig, policy: torch.nn.Module) -> LoraAdapter:
    """``[lora]``'s adapters injected into ``policy`` in place (its target modules
    checked against the model's linear layers first; `ConfigError` on a bad one)."""
    from temper.trainer.lora import LoraAdapter  # imports peft

    return LoraAdapter.wrap(policy, lora)


def teacher_path(cfg: Config, model: RunModel) -> str | None:
    """``distill.teacher`` when the trainer holds it (every rank loads it whole), checked;
    None without distillation or for a served teacher (a URL), which scores on the
    rollout side. The teacher scores the student's sampled ids as they are, so every
    student (token, id) pair must be the teacher's too (a teacher may know more tokens)
    and, for a vision-language student, be one too; `ConfigError` (one line, exit 2)
    otherwise."""
    path = cfg.distill.teacher
    if cfg.algo.advantage != "distill" or is_remote_teacher(path):
        return None
    assert path is not None  # check_distill
    try:
        teacher_vocab = load_tokenizer(path).get_vocab()
    except ModelLoadError as exc:
        raise ConfigError(f"distill.teacher: {exc}") from exc
    # The teacher may know more tokens (a padded or extended vocabulary): the student's
    # ids only have to mean the same to it.
    differ = sorted(set(model.tokenizer.get_vocab().items()) - set(teacher_vocab.items()))
    if differ:
        raise ConfigError(
            f"distill.teacher {path!r} has another tokenizer than the student "
            f"{cfg.model.path!r}: {len(differ)} of the student's (token, id) pairs are not "
            f"the teacher's, e.g. {differ[0]!r}; the teacher scores the student's token ids, "
            "so it must give every one of them the same meaning"
        )
    if is_vision_language(path) != (model.vision is not None):
        kinds = ("a text model", "a vision-language model")
        raise ConfigError(
            f"distill.teacher {path!r} is {kinds[is_vision_language(path)]} and the student "
            f"is {kinds[model.vision is not None]}: the teacher sees what the student sees"
        )
    return path


def build_remote_teacher(cfg: Config, model: RunModel) -> RemoteTeacher | None:
    """``distill.teacher`` when it is a server's URL: connected and checked against the
    student's tokenizer (`temper.rollout.remote_teacher`); None otherwise."""
    d = cfg.distill
    if cfg.algo.advantage != "distill" or not is_remote_teacher(d.teacher):
        return None
    assert d.teacher is not None
    if model.vision is not None:
        raise ConfigError(
            f"distill.teacher {d.teacher!r} is a server, and the student is a vision-language "
            "model: a served teacher scores token ids only, not images; use a teacher path"
        )
    return RemoteTeacher.connect(d.teacher, model.tokenizer, d.teacher_model, d.teacher_timeout_s)


def build_critic(cfg: Config, policy: torch.nn.Module, device: torch.device) -> Critic:
    """PPO's critic (`temper.trainer.critic`): a value model loaded from
    ``critic.model_path`` (default: the policy's starting weights), or a head."""
    value_model = None
    if cfg.critic.kind == "model":
        value_model = load_model(cfg.critic.model_path or cfg.model.path).to(device)
    o, t = cfg.orchestrator, cfg.trainer
    return Critic(cfg.critic, t, policy, value_model, o.steps * t.ppo_epochs * t.mini_batches)
