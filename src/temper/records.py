"""The shared records every floor passes around: `Task` and `Trajectory`.

A `Task` is the unit a rollout starts from; a `Trajectory` is what one episode
(or one sample) of a task became, in exact tokens. They sit on the ground
floor, importing nothing of Temper, so data, rewards, envs, rollouts, the
trainer and the dashboard can all name them without importing each other.

`Trajectory`, token-in/token-out: `prompt_ids` are the ids the engine was given and
`response_ids` everything after them — sampled tokens and, in multi-turn
episodes, observation tokens appended between turns. `loss_mask[i]` is 1 only
for tokens the policy sampled; `behaviour_logprobs[i]` and `versions[i]` are the
engine's logprob and weight version for sampled tokens (0.0 / -1 elsewhere).
Nothing here is ever re-tokenised from text.

Multi-turn episodes (`temper.rollout.multi_turn`) also fill the fields after
`advantage`: `turn_spans[k]` is the [start, end) range of turn k's sampled ids
in `response_ids`, `turn_rewards[k]` its env reward (0.0 when the env gave
none), `messages` the conversation as chat messages (for logs and judges),
`env_info`/`env_metrics` the env's merged info and summed counters, and
`env_error` the reason when the env failed, and `episode_seed` / `task` the
seed and task the env was reset with (what `temper replay` needs). `images`
names the images the sequence shows, by content hash and token offset.
Single-turn trajectories keep the defaults (one turn, nothing else). `answer` is the task's reference answer, when it has one.

`advantage` is the one advantage the loss puts on every policy token (outcome
credit); with turn-level credit (`algo.credit = "turn"`) `token_advantages`
holds one per response token instead and `advantage` keeps turn 0's value, for logs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Task:
    """One prompt with what is needed to score it.

    `prompt` is either plain text (sent as a single user message) or a list of
    chat messages (`{"role": ..., "content": ...}`). `answer` is the reference
    answer for verifiable rewards (may be None). `columns` carries every other
    dataset column, passed to reward functions as keyword arguments.
    """

    id: str
    prompt: str | list[dict[str, Any]]
    answer: str | None = None
    category: str = "default"
    columns: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return list(self.prompt)


@dataclass
class Trajectory:
    task_id: str
    group_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    versions: list[int]
    finish_reason: str
    prompt_text: str = ""
    response_text: str = ""
    category: str = "default"
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_error: str | None = None
    correct: bool | None = None
    #: True: `correct` is the verdict the reward declared; False: no reward component
    #: declared one, so `correct` is the default rule, reward >= 1; None: not recorded.
    correct_declared: bool | None = None
    advantage: float = 0.0
    num_turns: int = 1
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    env_info: dict[str, Any] = field(default_factory=dict)
    env_metrics: dict[str, float] = field(default_factory=dict)
    env_error: str | None = None
    episode_seed: int | None = None
    task: dict[str, Any] | None = None
    #: The trainer's logprob of each response token on its first pass (before
    #: any update), for the train/inference mismatch; None until trained on.
    trainer_logprobs: list[float] | None = None
    #: A distillation teacher's logprob of each response token, when a served teacher
    #: scored it on the rollout side (`temper.rollout.remote_teacher`); None otherwise.
    teacher_logprobs: list[float] | None = None
    #: The task's reference answer (what `temper inspect` shows as the target).
    answer: str | None = None
    #: Images, as ``[offset, sha256]`` pairs in order: the image's token run starts
    #: at ``offset`` in ``prompt_ids + response_ids``. The pixels live in the run's
    #: image store under the hash (`temper.vision.ImageStore`), once per run.
    images: list[list[Any]] = field(default_factory=list)
    #: One advantage per response token (turn-level credit, `temper.algos.turn_credit`),
    #: or None: every token has `advantage` (outcome credit).
    token_advantages: list[float] | None = None
    #: An agent episode's earlier training rows (`temper.agents`): where the agent's
    #: history stopped extending token-exactly, a new row began. They share this
    #: episode's reward and advantage and are trained beside it; groups, evals and
    #: metrics count the episode once.
    extra_rows: list[Trajectory] = field(default_factory=list)

    def __post_init__(self) -> None:
        # From JSON (a worker's reply, a run's trajectories/ file) the rows come as dicts.
        self.extra_rows = [
            r if isinstance(r, Trajectory) else Trajectory(**r) for r in self.extra_rows
        ]
        n = len(self.response_ids)
        if not (len(self.loss_mask) == len(self.behaviour_logprobs) == len(self.versions) == n):
            raise ValueError(
                f"trajectory {self.task_id}: response_ids, loss_mask, behaviour_logprobs and "
                f"versions must have equal length, got {n}, {len(self.loss_mask)}, "
                f"{len(self.behaviour_logprobs)}, {len(self.versions)}"
            )
        if self.token_advantages is not None and len(self.token_advantages) != n:
            raise ValueError(
                f"trajectory {self.task_id}: {len(self.token_advantages)} token_advantages "
                f"for {n} response tokens"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def advantage_row(self) -> list[float] | float:
        """What the trainer puts on the response tokens: `token_advantages`, or the
        one `advantage` (broadcast) when there are none."""
        return self.advantage if self.token_advantages is None else self.token_advantages

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def prompt_images(self) -> list[str]:
        """Hashes of the images inside the prompt, in order."""
        n = len(self.prompt_ids)
        return [str(sha) for offset, sha in self.images if offset < n]

    @property
    def response_images(self) -> list[str]:
        """Hashes of the images inside the response (observations), in order."""
        n = len(self.prompt_ids)
        return [str(sha) for offset, sha in self.images if offset >= n]

    def prompt_key(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """What makes two prompts the same: their ids *and* their images (two
        pictures give the same image-token ids, so ids alone would merge them)."""
        return tuple(self.prompt_ids), tuple(self.prompt_images)
