"""Build the run's components from a Config."""

from __future__ import annotations

import random
from typing import Any

import torch

from temper.config import Config
from temper.config.sampler import SamplerConfig
from temper.config.schema import DataConfig, RewardConfig
from temper.data.base import Task
from temper.data.sampler import ListSampler, ProceduralSampler, TaskSampler
from temper.data.task_sampling import (
    AdaptiveSampler,
    CategorisedGenerator,
    CategoryArms,
    TaskArms,
    curriculum,
    targeted,
    weighted,
)
from temper.devices import resolve_device
from temper.engine.base import Engine
from temper.errors import ConfigError, DataError
from temper.models.loader import resolve_model_path
from temper.orchestrator.backend import Rollouts
from temper.rewards.base import Reward
from temper.rollout.single_turn import PromptRenderer
from temper.rollout.sources import EpisodeRollouts, SingleTurnRollouts
from temper.vision.processor import VisionProcessor, vision_for
from temper.vision.prompting import PromptImages
from temper.vision.store import ImageStore


def build_tasks(cfg: DataConfig, seed: int) -> tuple[TaskSampler, list[Task]]:
    """(training sampler, held-out eval tasks)."""
    if cfg.type == "arithmetic":
        from temper.data.arithmetic import ArithmeticTasks

        gen = ArithmeticTasks(levels=tuple(cfg.levels), seed=seed)
        return ProceduralSampler(gen, seed), gen.heldout(cfg.eval_size)
    if cfg.type == "visual":
        from temper.data.visual import VisualTasks

        visual = VisualTasks(kinds=tuple(cfg.kinds), seed=seed)
        return ProceduralSampler(visual, seed), visual.heldout(cfg.eval_size)
    from temper.data.datasets import load_tasks

    kwargs: dict[str, Any] = dict(
        prompt_field=cfg.prompt_field,
        answer_field=cfg.answer_field,
        image_field=cfg.image_field,
        id_field=cfg.id_field,
        category_field=cfg.category_field,
        answer_extractor=cfg.answer_extractor,
    )
    train = load_tasks(cfg.path, **kwargs)
    if cfg.eval_path:
        heldout = load_tasks(cfg.eval_path, **kwargs)[: cfg.eval_size]
    else:
        order = list(range(len(train)))
        random.Random(seed).shuffle(order)
        n_eval = min(cfg.eval_size, len(train) // 5)
        if n_eval == 0 or len(train) - n_eval == 0:
            raise DataError(
                f"dataset {cfg.path} has {len(train)} rows: too few to split off a held-out "
                "set; set data.eval_path"
            )
        heldout = [train[i] for i in order[:n_eval]]
        train = [train[i] for i in order[n_eval:]]
    return ListSampler(train, seed), heldout


def build_sampler(cfg: SamplerConfig, base: TaskSampler, seed: int) -> TaskSampler:
    """The configured task sampler over the tasks of ``base`` (the uniform sampler the data
    or env gives); ``base`` itself for ``type = "uniform"``."""
    if cfg.type == "uniform":
        return base
    by = "category" if cfg.type == "curriculum" else cfg.stats_by
    if isinstance(base, ListSampler):
        by = "task" if by == "auto" else by
        arms: TaskArms | CategoryArms = (
            TaskArms(base.tasks) if by == "task" else CategoryArms(seed, tasks=base.tasks)
        )
    elif isinstance(base, ProceduralSampler) and isinstance(base.generator, CategorisedGenerator):
        if by == "task":
            raise ConfigError(
                "sampler.stats_by = 'task' needs a finite task list: procedural tasks rarely "
                "repeat, so their statistics are kept per category"
            )
        arms = CategoryArms(seed, generator=base.generator)
    else:
        raise ConfigError(
            f"sampler.type = {cfg.type!r} needs a task list or a generator with categories "
            f"(arithmetic, visual); this run's tasks come from {type(base).__name__}"
        )
    if cfg.type == "targeted":
        policy = targeted(cfg.target, cfg.explore)
    elif cfg.type == "curriculum":
        for point in cfg.schedule:
            unknown = sorted(set(point.weights) - set(arms.keys))
            if unknown:
                raise ConfigError(
                    f"sampler.schedule (step {point.step}): unknown category {unknown[0]!r}; "
                    f"the tasks' categories are {', '.join(arms.keys)}"
                )
        policy = curriculum(cfg.schedule)
    else:
        from temper.rewards.trl_adapter import load_reward_function

        assert cfg.function is not None
        fn = load_reward_function(cfg.function, what="sampler.function")
        policy = weighted(fn, cfg.function)
    return AdaptiveSampler(arms, policy, seed, cfg.decay, cfg.type)


def build_reward(cfg: RewardConfig, tokenizer: Any = None) -> Reward:
    """The weighted sum of `cfg.components`, gated by `cfg.filters` when any are on.

    `tokenizer` (optional) measures lengths for type=overlong; without it they
    are whitespace-separated tokens.
    """
    from temper.rewards.combine import WeightedSum
    from temper.rewards.format_reward import ExactMatchReward, FormatReward, JSONSchemaReward
    from temper.rewards.math_verify_reward import MathVerifyReward
    from temper.rewards.shaping import (
        Detector,
        GatedReward,
        GibberishDetector,
        OverlongPenalty,
        RepetitionDetector,
    )
    from temper.rewards.trl_adapter import TRLRewardFunction, load_reward_function

    parts: list[tuple[Reward, float]] = []
    for comp in cfg.components:
        if comp.type == "math":
            r: Reward = MathVerifyReward(timeout_s=cfg.timeout_s, workers=cfg.workers)
        elif comp.type == "format":
            r = FormatReward(comp.pattern) if comp.pattern else FormatReward()
        elif comp.type == "overlong":
            assert comp.max_tokens is not None and comp.cache_tokens is not None
            r = OverlongPenalty(comp.max_tokens, comp.cache_tokens, tokenizer=tokenizer)
        elif comp.type == "exact":
            r = ExactMatchReward()
        elif comp.type == "json_schema":
            r = JSONSchemaReward(comp.json_schema, schema_field=comp.schema_field)
        elif comp.type == "tool_call_ast":
            from temper.rewards.tool_call_ast import ToolCallASTReward

            r = ToolCallASTReward(comp.ground_truth_field, comp.functions_field)
        elif comp.type == "reward_model":
            from temper.rewards.reward_model import RewardModelReward

            r = RewardModelReward(base_url=comp.base_url, model=comp.model)
        elif comp.type == "judge":
            from temper.engine.openai_endpoint import api_key_from_env
            from temper.rewards.judge import JudgeReward

            assert comp.base_url is not None and comp.model is not None
            key = api_key_from_env(comp.api_key_env) or "EMPTY"
            r = JudgeReward(comp.base_url, comp.model, key)
        else:
            assert comp.function is not None
            r = TRLRewardFunction(load_reward_function(comp.function))
        parts.append((r, comp.weight))
    total: Reward = WeightedSum(parts, on_error=cfg.on_error)
    detectors: list[Detector] = []
    if "repetition" in cfg.filters:
        detectors.append(RepetitionDetector(cfg.repetition_ngram, cfg.repetition_threshold))
    if "gibberish" in cfg.filters:
        detectors.append(GibberishDetector(cfg.gibberish_threshold))
    return GatedReward(total, detectors) if detectors else total


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def build_engine(cfg: Config, model_path: str, tokenizer: Any) -> Engine:
    """The configured engine (for training, eval, serving and rollout workers alike).

    ``"openai"`` keeps only the tokenizer here; ``"vllm"`` loads ``model_path``
    itself; ``"native"`` and ``"hf"`` run an HF model loaded here, on
    ``engine.device``.
    """
    from temper.engine import build_engine as make

    e = cfg.engine
    if e.type == "openai":
        from temper.engine.openai_endpoint import api_key_from_env

        return make(
            "openai",
            None,
            tokenizer,
            base_url=e.base_url,
            model_name=e.model_name,
            api_key=api_key_from_env(e.api_key_env),
            timeout_s=e.timeout_s,
        )
    device = resolve_device(e.device, "engine.device")
    if e.type == "vllm":
        return make(
            "vllm",
            None,
            tokenizer,
            model_path=model_path,
            dtype=cfg.model.dtype,
            device=device.type,
            seed=cfg.run.seed,
            prefix_caching=e.prefix_cache_mb > 0,
            kv_cache_gb=e.kv_cache_gb,
            gpu_memory_utilization=e.gpu_memory_utilization,
            enable_sleep=e.sleep,
            max_num_seqs=e.max_slots,
        )
    from temper.models import load_model

    model = load_model(model_path, dtype=torch_dtype(cfg.model.dtype)).to(device)
    vision = build_vision(cfg)
    opts: dict[str, Any] = {"vision": vision} if vision is not None else {}
    if e.type == "native":
        opts |= {
            "max_slots": e.max_slots,
            "prefix_cache_mb": e.prefix_cache_mb,
            "cpu_kernels": e.cpu_kernels,
        }
    return make(e.type, model, tokenizer, **opts)


def build_run_tasks(cfg: Config) -> tuple[TaskSampler, list[Task], Any]:
    """(training sampler, held-out tasks, env spec or None): the env's own tasks when it
    has them, else the configured data."""
    spec = None
    if cfg.env.enabled:
        from temper.envs.registry import build_env_spec

        spec = build_env_spec(cfg.env.type, cfg.env.options, cfg.run.seed)
        if spec.train is not None and spec.heldout is not None:
            return build_sampler(cfg.sampler, spec.train, cfg.run.seed), spec.heldout, spec
    train, heldout = build_tasks(cfg.data, cfg.run.seed)
    if spec is not None:
        train = spec.train if spec.train is not None else train
        heldout = spec.heldout if spec.heldout is not None else heldout
    return build_sampler(cfg.sampler, train, cfg.run.seed), heldout, spec


def build_vision(cfg: Config) -> VisionProcessor | None:
    """The image processor of ``model.path`` when it is a vision-language model (one per
    process, shared by engine, renderer and trainer); None for a text model."""
    if cfg.engine.type == "openai":
        return None
    return vision_for(str(resolve_model_path(cfg.model.path)))


def build_rollouts(
    cfg: Config, engine: Any, tokenizer: Any, image_store: ImageStore | None = None
) -> Rollouts:
    """Single-turn prompts (``env.type = "none"``) or episodes of the configured env.

    ``image_store``: where a training run keeps the images its prompts show (the
    trainer reads them back by hash); None keeps none (eval, serving).
    """
    train, heldout, spec = build_run_tasks(cfg)
    if spec is None:
        reward = build_reward(cfg.reward, tokenizer)
        renderer = PromptRenderer(
            tokenizer, cfg.data.system_prompt, vision=build_vision(cfg), store=image_store
        )
        return Rollouts(
            SingleTurnRollouts(engine, renderer, reward), train, heldout, reward, renderer
        )
    reward = build_reward(cfg.reward, tokenizer) if cfg.env.add_reward else None
    vision = build_vision(cfg)
    images = PromptImages(vision, image_store) if vision is not None else None
    source = EpisodeRollouts(
        engine, spec, tokenizer, cfg.env.limits, reward, cfg.env.max_concurrency, images
    )
    return Rollouts(source, train, heldout, reward, None, spec)
