"""Multi-turn rollouts: drive an Env against an Engine, token in / token out.

The trajectory is built from ids only, never from re-tokenised text:

1. `prompt_ids` = the chat template's rendering of the env's first
   observation with the generation prompt.
2. Each turn: the engine gets all ids so far and its sampled ids are appended
   exactly (loss mask 1, the engine's logprobs and policy versions).
3. Unless the episode ends, the loop then appends, with loss mask 0,
   logprob 0.0 and version -1: `IncrementalRenderer.close_turn(sampled)` (the
   separator the template puts after an end-of-turn token, e.g. ChatML's "\\n"
   after `<|im_end|>`; or, when the sample did not end with the end-of-turn
   token, that token and the separator) followed by
   `IncrementalRenderer.observation(new messages)` (only the new messages'
   tokens and the next generation prompt).

So at every turn the engine's input equals the trajectory's ids so far. The
episode ends when the env says done or a limit (`EpisodeLimits`) is hit; the
reason is the trajectory's `finish_reason`. Env exceptions end the episode
with "env_error" and the reason in `env_error`; they are never raised. A
tool-call parser that raises becomes a "parser_error" parse error of that turn.
Engine errors and a first observation too long for the context are raised.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from temper.config.env import EpisodeLimits
from temper.engine.base import Engine, SampleOutput, SamplingParams
from temper.envs.base import AssistantTurn, Env, EpisodeFinish, Message, StepResult
from temper.errors import InfraError, PromptTooLongError
from temper.models.chat_template import IncrementalRenderer
from temper.models.tool_calls import ToolCall, ToolCallError, parse_tool_calls
from temper.records import Task, Trajectory
from temper.vision.images import Image, ImageError, has_images, loggable, normalize_messages
from temper.vision.prompting import PromptImages

#: Turns a turn's text into (tool calls, parse errors); the default reads Hermes blocks.
ToolCallParser = Callable[[str], tuple[list[ToolCall], list[ToolCallError]]]

#: Spacing of per-turn sampling seeds within an episode (> EpisodeLimits.max_turns).
_TURN_SEED_STRIDE = 1009
#: Spacing of episode seeds per task in `run_episodes` (as in single-turn groups).
_TASK_SEED_STRIDE = 100003


@dataclass
class _Episode:
    """The trajectory under construction; kept whole when a timeout interrupts a turn."""

    prompt_ids: list[int] = field(default_factory=list)
    prompt_text: str = ""
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    env_info: dict[str, Any] = field(default_factory=dict)
    env_metrics: dict[str, float] = field(default_factory=dict)
    env_error: str | None = None
    finish: EpisodeFinish = "max_turns"
    generated: int = 0
    #: Images shown so far: (offset of the token run in prompt + response, image).
    images: list[tuple[int, Image]] = field(default_factory=list)

    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_sample(self, sample: SampleOutput, fallback_version: int) -> None:
        n = len(sample.token_ids)
        start = len(self.response_ids)
        self.response_ids += sample.token_ids
        self.loss_mask += [1] * n
        self.logprobs += [float(x) for x in sample.logprobs]
        self.versions += list(sample.policy_versions or [fallback_version] * n)
        self.turn_spans.append((start, start + n))
        self.generated += n

    def add_step(self, result: StepResult) -> None:
        self.turn_rewards.append(float(result.reward) if result.reward is not None else 0.0)
        self.env_info.update({k: _jsonable(v) for k, v in result.info.items()})
        for key, value in result.metrics.items():
            self.env_metrics[key] = self.env_metrics.get(key, 0.0) + float(value)

    def add_observation(self, ids: list[int], messages: list[Message]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        self.messages += messages

    def fail(self, where: str, exc: Exception) -> None:
        self.finish = "infra_error" if isinstance(exc, InfraError) else "env_error"
        self.env_error = f"{where}: {type(exc).__name__}: {exc}"

    def trajectory(self, task: Task, group_id: int, tokenizer: Any) -> Trajectory:
        return Trajectory(
            task_id=task.id,
            group_id=group_id,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            loss_mask=self.loss_mask,
            behaviour_logprobs=self.logprobs,
            versions=self.versions,
            finish_reason=self.finish,
            prompt_text=self.prompt_text,
            response_text=tokenizer.decode(self.response_ids, skip_special_tokens=False),
            category=task.category,
            answer=task.answer,
            reward=sum(self.turn_rewards),
            num_turns=len(self.turn_spans),
            turn_spans=self.turn_spans,
            turn_rewards=self.turn_rewards,
            messages=self.messages,
            env_info=self.env_info,
            env_metrics=self.env_metrics,
            env_error=self.env_error,
            images=[[offset, image.sha256] for offset, image in self.images],
        )


def _jsonable(value: Any) -> Any:
    """`value` if JSON can encode it, else its repr (run directories write JSON)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _turn_text(tokenizer: Any, sample: SampleOutput, stop_ids: Sequence[int]) -> str:
    """The turn's text without the stop token that ended it (special tokens kept)."""
    ids = sample.token_ids
    stop = sample.stop_reason
    # A stop *string* is part of the text; a stop token is not. Engines that do not
    # name the stop (stop_reason None) are trusted only for the known stop ids.
    if (
        ids
        and sample.finish_reason == "stop"
        and (ids[-1] == stop or (stop is None and ids[-1] in stop_ids))
    ):
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


def _turn_budget(
    ep: _Episode, params: SamplingParams, limits: EpisodeLimits, max_total: int
) -> int:
    """`max_new_tokens` for the next turn: the sampling setting, clipped by the token limits."""
    budget = min(params.max_new_tokens, max_total - len(ep.ids()))
    if limits.max_generated_tokens is not None:
        budget = min(budget, limits.max_generated_tokens - ep.generated)
    return budget


def _sample_finish(
    sample: SampleOutput, budget: int, params: SamplingParams, limits: EpisodeLimits
) -> EpisodeFinish | None:
    """Why a sampled turn ends the episode, or None when the env should step on it."""
    if sample.finish_reason == "abort":
        return "abort"
    if sample.finish_reason == "length":
        if budget < params.max_new_tokens:  # cut by a token limit, not by the sampling setting
            return "token_budget"
        if not limits.continue_after_length:
            return "length"
    return None


def _turn_seed(seed: int | None, turn: int) -> int | None:
    return None if seed is None else seed * _TURN_SEED_STRIDE + turn


async def run_episode(
    engine: Engine,
    env: Env,
    task: Task,
    tokenizer: Any,
    params: SamplingParams,
    limits: EpisodeLimits | None = None,
    seed: int | None = None,
    *,
    group_id: int = 0,
    parser: ToolCallParser = parse_tool_calls,
    images: PromptImages | None = None,
) -> Trajectory:
    """Play one episode of `env` on `task` and return its trajectory.

    `params` apply to every turn, except that `n` is 1, `max_new_tokens` is
    clipped by the token limits, and (when `seed`, else `params.seed`, is set)
    turn k samples with seed `seed * 1009 + k`. The env is reset here but not
    closed (the caller owns it; `run_episodes` closes the envs it makes).
    Raises `PromptTooLongError` if the first observation leaves no room to
    generate, and `ChatTemplateError` if the template cannot be rendered
    incrementally. Observations may show images when ``images`` (a VLM's
    `PromptImages`) is given; each image's token run is spliced in where the
    template put its placeholder, and the engine gets every image shown so far.
    """
    limits = limits or EpisodeLimits()
    episode = _Episode()
    try:
        async with asyncio.timeout(limits.timeout_s) as deadline:
            await _play(engine, env, task, tokenizer, params, limits, seed, parser, episode, images)
    except TimeoutError:
        if not deadline.expired():
            raise
        episode.finish = "timeout"
    traj = episode.trajectory(task, group_id, tokenizer)
    traj.episode_seed = seed
    traj.task = _task_record(task)
    return traj


def _task_record(task: Task) -> dict[str, Any]:
    """The task as the trajectory records it: JSON, so a prompt's images (PIL
    images, bytes, ...) are named by hash as in `messages`; the pixels are in the
    run's image store."""
    record = asdict(task)
    if isinstance(task.prompt, list) and has_images(task.prompt):
        try:
            record["prompt"] = loggable(normalize_messages(task.prompt))
        except ImageError as exc:  # the episode itself failed on it; keep the record writable
            record["prompt"] = f"[prompt with an unreadable image: {exc}]"
    return record


async def _play(
    engine: Engine,
    env: Env,
    task: Task,
    tokenizer: Any,
    params: SamplingParams,
    limits: EpisodeLimits,
    seed: int | None,
    parser: ToolCallParser,
    ep: _Episode,
    images: PromptImages | None = None,
) -> None:
    """The turn loop; sets `ep.finish` and returns when the episode ends."""
    try:
        first = await env.reset(task, seed)
        tools = list(env.tools or [])
    except Exception as exc:
        return ep.fail("reset", exc)
    renderer = IncrementalRenderer(tokenizer, tools, stop_token_ids=params.stop_token_ids)
    shown = images or PromptImages()
    try:
        first = shown.normalize(first)
    except ImageError as exc:
        return ep.fail("reset", exc)
    ids, ep.prompt_text = renderer.prompt(first)
    ep.prompt_ids = shown.splice(ids, first, 0, ep.images)
    ep.messages = loggable(first)
    max_total = min(limits.max_total_tokens or engine.max_context, engine.max_context)
    if len(ep.prompt_ids) >= max_total:
        raise PromptTooLongError(
            f"task {task.id}: the first observation is {len(ep.prompt_ids)} tokens, which "
            f"leaves no room to generate within {max_total} tokens"
        )
    seed = seed if seed is not None else params.seed
    stop_ids = [*params.stop_token_ids, *renderer.end_of_turn_ids, tokenizer.eos_token_id]
    for index in range(limits.max_turns):
        budget = _turn_budget(ep, params, limits, max_total)
        if budget < 1:
            ep.finish = "token_budget"
            return
        turn_params = replace(params, n=1, max_new_tokens=budget, seed=_turn_seed(seed, index))
        sample = (await shown.generate(engine, ep.ids(), turn_params, ep.images)).samples[0]
        ep.add_sample(sample, engine.version)
        text = _turn_text(tokenizer, sample, stop_ids)
        ep.messages.append({"role": "assistant", "content": text})
        finish = _sample_finish(sample, budget, params, limits)
        if finish is not None:
            ep.finish = finish
            return
        calls, errors = _parse(parser, text)
        turn = AssistantTurn(
            text, list(sample.token_ids), calls, errors, sample.finish_reason, index
        )
        try:
            result = await env.step(turn)
        except Exception as exc:
            return ep.fail(f"step {index}", exc)
        ep.add_step(result)
        if result.done:
            ep.finish = "done"
            return
        if index + 1 == limits.max_turns:
            break  # no next turn: the observation would never be read
        closing = renderer.close_turn(sample.token_ids)
        try:
            observation = shown.normalize(result.observation)
        except ImageError as exc:
            return ep.fail(f"step {index} observation", exc)
        placed: list[tuple[int, Image]] = []
        at = len(ep.ids()) + len(closing)
        obs = closing + shown.splice(renderer.observation(observation), observation, at, placed)
        if len(ep.ids()) + len(obs) >= max_total:
            ep.finish = "token_budget"
            return
        ep.images += placed
        ep.add_observation(obs, loggable(observation))
    ep.finish = "max_turns"


def _parse(parser: ToolCallParser, text: str) -> tuple[list[ToolCall], list[ToolCallError]]:
    """The parser's reading of a turn; a parser that raises gives one "parser_error"
    (the env answers it like any unparseable call, an ``error: ...`` observation),
    so a bad parser costs that turn its calls, not the episode or its group."""
    try:
        return parser(text)
    except Exception as exc:
        message = f"the tool-call parser raised {type(exc).__name__}: {exc}"
        return [], [ToolCallError("parser_error", message.splitlines()[0], 0, text)]


async def run_episodes(
    engine: Engine,
    make_env: Callable[[Task], Env],
    tasks: Sequence[Task],
    tokenizer: Any,
    params: SamplingParams,
    limits: EpisodeLimits | None = None,
    seed: int | None = None,
    *,
    group_size: int = 1,
    max_concurrency: int | None = None,
    parser: ToolCallParser = parse_tool_calls,
    images: PromptImages | None = None,
    infra_retries: int = 2,
) -> list[list[Trajectory]]:
    """Run `group_size` episodes per task concurrently against one engine.

    Each episode gets a fresh env from `make_env(task)`, closed when the
    episode ends (a failing close is recorded in `env_info["close_error"]`).
    Returns one group per task, in order; group i's trajectories have
    `group_id=i`. With `seed`, episode j of task i uses seed
    `seed * 100003 + i * group_size + j`. `max_concurrency` bounds the episodes
    in flight (None: all at once). If one episode raises, the others are
    cancelled (their envs closed) and the error is re-raised. An episode that ends
    with "infra_error" is played again from the start in a fresh env (the same seed), up
    to `infra_retries` times; one that still fails keeps that finish, with a NaN reward
    so that no group statistic and no update counts it (`env_info["infra_retries"]`
    says how often it was retried).
    """
    if group_size < 1 or (max_concurrency is not None and max_concurrency < 1):
        raise ValueError(
            f"group_size and max_concurrency must be >= 1, got {group_size}, {max_concurrency}"
        )
    gate = asyncio.Semaphore(max_concurrency or len(tasks) * group_size or 1)

    async def one(i: int, j: int) -> Trajectory:
        episode_seed = None if seed is None else seed * _TASK_SEED_STRIDE + i * group_size + j
        async with gate:
            attempt = 0
            while True:
                env = make_env(tasks[i])
                try:
                    traj = await run_episode(
                        engine, env, tasks[i], tokenizer, params, limits, episode_seed,
                        group_id=i, parser=parser, images=images,
                    )  # fmt: skip
                finally:
                    close_error = await _close(env)
                if traj.finish_reason != "infra_error" or attempt == infra_retries:
                    break
                attempt += 1
            if close_error:
                traj.env_info["close_error"] = close_error
            if attempt:
                traj.env_info["infra_retries"] = attempt
            if traj.finish_reason == "infra_error":
                traj.reward = math.nan
            return traj

    jobs = [asyncio.ensure_future(one(i, j)) for i in range(len(tasks)) for j in range(group_size)]
    try:
        flat = await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    return [flat[i * group_size : (i + 1) * group_size] for i in range(len(tasks))]


async def _close(env: Env) -> str | None:
    try:
        await env.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def episode_stats(trajs: Iterable[Trajectory]) -> dict[str, float]:
    """Counts over episodes: `episodes`, `turns_mean`, `finish/<reason>` (with
    `finish/infra_error`), `env_errors` (the env's own), `infra_retries`,
    and the sum of every `env_metrics` counter (e.g. `tool_error_bad_json`)."""
    trajs = list(trajs)
    stats: Counter[str] = Counter()
    for t in trajs:
        stats[f"finish/{t.finish_reason}"] += 1
        stats["env_errors"] += t.env_error is not None and t.finish_reason != "infra_error"
        stats["infra_retries"] += t.env_info.get("infra_retries", 0)
        for key, value in t.env_metrics.items():
            stats[key] += value
    out = {"episodes": float(len(trajs)), **{k: float(v) for k, v in stats.items()}}
    out["turns_mean"] = sum(t.num_turns for t in trajs) / len(trajs) if trajs else 0.0
    return out
