"""A run's tasks from their config: the `[data]` section, the `[env]` spec factory (whose
env may bring its own tasks), and the `[sampler]` that draws them."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from temper.config import Config
from temper.config.env import EnvConfig
from temper.config.sampler import SamplerConfig
from temper.config.schema import DataConfig
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
from temper.envs.registry import BUILTIN_ENVS, EnvSpec
from temper.envs.service.client import EnvFleet, check_servers, remote_spec
from temper.envs.service.messages import env_fingerprint
from temper.errors import ConfigError, DataError
from temper.records import Task, Trajectory
from temper.targets import load_target
from temper.trainer.preference import ResponsePair


@dataclass
class RunTasks:
    """What a run trains and evaluates on, and the env spec its episodes come from
    (None for single-turn prompts)."""

    train: TaskSampler
    heldout: list[Task]
    env_spec: EnvSpec | None = None


def build_tasks(cfg: DataConfig, seed: int) -> tuple[TaskSampler, list[Task]]:
    """(training sampler, held-out eval tasks) of the `[data]` section."""
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
    assert cfg.path is not None  # DataConfig requires it for type = "file"
    train = load_tasks(cfg.path, **kwargs)
    if cfg.eval_path:
        return ListSampler(train, seed), load_tasks(cfg.eval_path, **kwargs)[: cfg.eval_size]
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    n_eval = min(cfg.eval_size, len(train) // 5)
    if n_eval == 0 or len(train) - n_eval == 0:
        raise DataError(
            f"dataset {cfg.path} has {len(train)} rows: too few to split off a held-out "
            "set; set data.eval_path"
        )
    heldout = [train[i] for i in order[:n_eval]]
    return ListSampler([train[i] for i in order[n_eval:]], seed), heldout


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
        assert cfg.function is not None  # SamplerConfig requires it for type = "weighted"
        policy = weighted(load_target(cfg.function, "sampler.function"), cfg.function)
    return AdaptiveSampler(arms, policy, seed, cfg.decay, cfg.type)


def build_env_spec(kind: str, options: dict[str, Any], seed: int) -> EnvSpec:
    """The `EnvSpec` of env ``kind`` (a built-in name, or ``"module:function"`` /
    ``"file.py:function"`` naming a spec factory) made with ``options``."""
    if kind not in BUILTIN_ENVS and ":" not in kind:
        raise ConfigError(
            f"env.type must be one of {', '.join(sorted(BUILTIN_ENVS))} or "
            f'"module:function" / "file.py:function", got {kind!r}'
        )
    factory = load_target(BUILTIN_ENVS.get(kind, kind), "env.type")
    try:
        spec = factory(dict(options), seed)
    except TypeError as exc:
        raise ConfigError(f"env.options do not fit env {kind!r}: {exc}") from exc
    if not isinstance(spec, EnvSpec):
        raise ConfigError(f"env {kind!r}: the factory returned {type(spec).__name__}, not EnvSpec")
    spec.name = spec.name or kind
    return spec


def build_remote_env_spec(spec: EnvSpec, cfg: EnvConfig, urls: list[str] | None = None) -> EnvSpec:
    """``spec`` with its episodes played on the env servers at ``urls`` (default
    ``cfg.servers``), after checking that each speaks this protocol and serves this env
    (`ConfigError` if not)."""
    fleet = EnvFleet(
        list(urls or cfg.servers),
        env_fingerprint(cfg.type, cfg.options),
        call_timeout_s=cfg.call_timeout_s,
        env_type=cfg.type,
        options=cfg.options,
    )
    check_servers(fleet)
    return remote_spec(spec, fleet)


def build_ray_env_servers(cfg: Config, spec: EnvSpec) -> EnvSpec:
    """Start ``env.ray_servers`` env-server actors and play ``spec``'s episodes on them
    (and on ``env.servers``); the spec's ``close`` stops the actors."""
    from temper.envs.service.ray_fleet import start_env_server_actors
    from temper.ray_cluster import start_ray

    if cfg.orchestrator.rollout_workers > 1 or cfg.orchestrator.backend != "local":
        raise ConfigError(
            "env.ray_servers starts actors from the local rollout loop; with rollout workers "
            "start a standing fleet (temper env-serve --ray N) and list it in env.servers"
        )
    start_ray(cfg)
    env = cfg.env
    actors = start_env_server_actors(
        env.ray_servers, build_env_spec, env.type, env.options, cfg.run.seed
    )
    try:
        remote = build_remote_env_spec(spec, env, [*env.servers, *actors.urls])
    except BaseException:
        actors.stop()
        raise
    remote.close = actors.stop
    return remote


def build_run_tasks(cfg: Config) -> RunTasks:
    """The env's own tasks when it has them, else the configured data; drawn by the
    configured sampler."""
    spec = None
    if cfg.env.enabled:
        spec = build_env_spec(cfg.env.type, cfg.env.options, cfg.run.seed)
        if cfg.env.ray_servers:
            spec = build_ray_env_servers(cfg, spec)
        elif cfg.env.servers:
            spec = build_remote_env_spec(spec, cfg.env)
        if spec.train is not None and spec.heldout is not None:
            return RunTasks(
                build_sampler(cfg.sampler, spec.train, cfg.run.seed), spec.heldout, spec
            )
    train, heldout = build_tasks(cfg.data, cfg.run.seed)
    if spec is not None:
        train = spec.train if spec.train is not None else train
        heldout = spec.heldout if spec.heldout is not None else heldout
    return RunTasks(build_sampler(cfg.sampler, train, cfg.run.seed), heldout, spec)


def build_sft_rows(cfg: Config, tokenizer: Any, max_context: int) -> list[Trajectory]:
    """The `[sft]` conversations (a file, or generated arithmetic dialogues), rendered as
    trajectories with the loss on assistant tokens. All read and rendered up front, so a
    bad row stops the run before it starts."""
    from temper.data.conversations import (
        ConversationRenderer,
        arithmetic_conversations,
        load_conversations,
    )

    s = cfg.sft
    if s.source == "file":
        assert s.path is not None  # SFTConfig requires it
        convs = load_conversations(s.path, s.messages_field)
    else:
        convs = arithmetic_conversations(s.size, cfg.data.levels, cfg.run.seed)
    renderer = ConversationRenderer(tokenizer, cfg.data.system_prompt)
    return [renderer.render(c, max_context) for c in convs]


def build_preference_pairs(
    cfg: Config, tokenizer: Any, max_context: int
) -> tuple[list[ResponsePair], list[ResponsePair]]:
    """(training pairs, held-out pairs) of the `[dpo]` section (a file, or the tiny reward
    model's synthetic pairs), rendered as chosen/rejected trajectories. All read and
    rendered up front, so a bad row stops the run before it starts."""
    from temper.data.conversations import ConversationRenderer
    from temper.data.preference_rows import load_preference_rows, render_pair, tiny_rm_rows

    d = cfg.dpo
    if d.source == "file":
        assert d.path is not None  # DPOConfig requires it
        fields = (d.prompt_field, d.chosen_field, d.rejected_field)
        train = load_preference_rows(d.path, *fields)
        if d.eval_path:
            heldout = load_preference_rows(d.eval_path, *fields)[: d.eval_size]
        else:
            order = list(range(len(train)))
            random.Random(cfg.run.seed).shuffle(order)
            n_eval = min(d.eval_size, len(train) // 5)
            if n_eval == 0:
                raise DataError(
                    f"dataset {d.path} has {len(train)} pairs: too few to split off held-out "
                    "pairs; set dpo.eval_path"
                )
            heldout = [train[i] for i in order[:n_eval]]
            train = [train[i] for i in order[n_eval:]]
    else:
        train = tiny_rm_rows(d.size, heldout=False, seed=cfg.run.seed)
        heldout = tiny_rm_rows(d.eval_size, heldout=True, seed=cfg.run.seed)
    renderer = ConversationRenderer(tokenizer, cfg.data.system_prompt)

    def pairs(rows: list[Any]) -> list[ResponsePair]:
        return [ResponsePair(*render_pair(renderer, r, i, max_context)) for i, r in enumerate(rows)]

    return pairs(train), pairs(heldout)
