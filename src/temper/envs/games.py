"""Two built-in multi-turn games with per-turn rewards: number guessing and Wordle.

`GuessNumberEnv`: the task holds a secret integer in `[lo, hi]`; each turn the
model guesses (the last `\\boxed{N}`, else the last integer in its text) and
hears "higher", "lower" or "correct". `WordleEnv`: the task holds a secret
5-letter word from `WORDS`; each turn the model guesses a word (the last
`\\boxed{...}`, else the last run of letters) and gets one mark per letter:
`G` right place, `Y` elsewhere in the word, `_` absent (duplicates as in
Wordle: greens first, then yellows while unmatched copies remain).

Both games are hermetic: observations and rewards depend only on the task and
the assistant turns (no randomness at all, so the episode seed is unused).
An unparseable or invalid turn gets an `error: ...` observation and a penalty,
does not use up a guess and does not end the episode; the rollout loop's
`EpisodeLimits.max_turns` bounds how many such turns a model can waste.
`info["success"]` is set on every step, so the merged `env_info` holds the
final value.

Tasks are procedural. Every secret belongs to one split by a stable hash
(about 20% held out, as in `temper.data.arithmetic`): `*.sample(rng, k)` never
yields a held-out secret and `*.heldout(n)` yields only held-out ones.
`guess_number_spec` and `wordle_spec` are the registry's spec factories.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from temper.data.sampler import ProceduralSampler
from temper.envs.base import AssistantTurn, Message, StepResult
from temper.envs.registry import EnvSpec
from temper.errors import ConfigError
from temper.records import Task
from temper.rewards.answers import extract_boxed

#: Share of all secrets in the held-out split, in percent.
HELDOUT_PERCENT = 20

# Common 5-letter English words: the secrets and the only accepted guesses.
_WORD_TEXT = """
about above adult after agent agree alarm album alike alive alone along among angle apple apply
argue arise aside asset avoid award badly basic begin being bench birth blade blame block blood
boost brain bread break brief bring brown brush burst buyer carry catch chain chair chase cheap
chest chief claim class clear climb close cloud coast count cover craft crane cream crime crowd
curve daily dance depth doubt drama dream drink drive earth eight empty enemy enter entry error
event exact exist faith false field fight flame floor force frame front fruit giant glass grace
grade grand grant great green guard guess guide happy heavy horse house human image index input
issue judge knife label large later laugh learn least legal level limit local loose lucky magic
major march match minor model month moral mount mouse movie music never night north novel ocean
offer order other paint panel party peace phone photo piece pilot place plain plant plate pound
power price pride print prior proof proud queen quick quite radio range rapid reach ready robot
rough route royal scale scene score sense seven shape sharp sheet shell shift shock shoot sight
skill slide small smile smoke solve sound space spare speed spend split sport stage stand state
steam stick still stone store story strip stuff style suite super table taste thank theme thing
think throw tight today topic touch tough track trade trend trial trust truth under union until
upper usage usual value video vital voice watch water where which white whole world worry wrong
young
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
_WORD_SET = frozenset(WORDS)
_INT = re.compile(r"-?\d+")
_LETTERS = re.compile(r"[A-Za-z]+")


def is_heldout(key: str, salt: str) -> bool:
    """True if `key` (a canonical secret) is in the held-out split; stable across machines."""
    digest = hashlib.sha256((salt + key).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def _options(options: dict[str, Any], defaults: dict[str, Any], env: str) -> dict[str, Any]:
    """`defaults` updated with `options`, each checked against its default's type.

    Float defaults take any number, int defaults an integer >= 1, None a
    string or None; other keys (e.g. `range`) are checked by the caller.
    """
    for key in options:
        if key not in defaults:
            raise ConfigError(
                f"env.options.{key}: unknown option for env {env!r}; "
                f"allowed: {', '.join(sorted(defaults))}"
            )
    out = {**defaults, **options}
    for key, default in defaults.items():
        value = out[key]
        if isinstance(default, float):
            ok, need = isinstance(value, int | float) and not isinstance(value, bool), "a number"
            out[key] = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            need = "an integer >= 1"
        elif default is None:
            ok, need = value is None or isinstance(value, str), "a string"
        else:
            continue
        if not ok:
            raise ConfigError(f"env.options.{key} must be {need}, got {value!r}")
    return out


def _to_int(digits: str) -> int | None:
    """int(digits), or None past Python's 4300-digit conversion limit (a model can write that)."""
    try:
        return int(digits)
    except ValueError:
        return None


class _SecretTasks:
    """Tasks keyed by a secret, split by a salted hash of it; subclasses draw and render."""

    salt = ""
    #: Extra draws `heldout` may spend, enough to exhaust a small pool of secrets.
    attempts = 0

    def draw(self, rng: random.Random) -> Task:
        """One task from either split."""
        raise NotImplementedError

    def is_heldout(self, task: Task) -> bool:
        """True if the task's secret is in the held-out split."""
        return is_heldout(str(task.columns["secret"]), self.salt)

    def sample(self, rng: random.Random, k: int = 1) -> list[Task]:
        """k training-split tasks drawn from `rng`. Raises ValueError if none can be found."""
        out: list[Task] = []
        for _ in range(10_000 + 10 * k):  # bounded: a split with no training secrets must fail
            if len(out) >= k:
                return out
            task = self.draw(rng)
            if not self.is_heldout(task):
                out.append(task)
        raise ValueError("no training-split task found: every secret drawn is held out")

    def heldout(self, n: int = 100, seed: int = 1234) -> list[Task]:
        """The same n distinct held-out tasks every time; fewer if the pool runs out first."""
        rng, seen, out = random.Random(seed), set(), []
        for _ in range(50 * n + self.attempts):
            if len(out) >= n:
                break
            task = self.draw(rng)
            if task.id not in seen and self.is_heldout(task):
                seen.add(task.id)
                out.append(task)
        return out


class _Game:
    """What both games share: no tools, an optional system prompt, the error step."""

    def __init__(self, invalid_penalty: float, system_prompt: str | None) -> None:
        self.invalid_penalty, self.system_prompt = invalid_penalty, system_prompt
        self._done = True  # until reset

    @property
    def tools(self) -> list[dict[str, Any]]:
        return []

    def _first(self, task: Task) -> list[Message]:
        self._done = False
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, *task.messages()]

    def _check(self) -> None:
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step called before reset or after the end")

    def _error(self, message: str, info: dict[str, Any]) -> StepResult:
        """An invalid turn: error observation, -invalid_penalty, episode goes on."""
        msg = {"role": "user", "content": f"error: {message}"}
        return StepResult([msg], -self.invalid_penalty, False, info, {"invalid_turns": 1.0})

    async def close(self) -> None:
        self._done = True


# ----------------------------------------------------------------------------- guess the number


class GuessNumberTasks(_SecretTasks):
    """Number-guessing tasks: secret uniform in `[lo, hi]`, split by a hash of the secret."""

    salt = "temper-guess-v1:"

    def __init__(self, lo: int = 1, hi: int = 100, max_guesses: int = 7) -> None:
        if hi <= lo:
            raise ValueError(f"guess_number range needs lo < hi, got [{lo}, {hi}]")
        self.lo, self.hi, self.max_guesses = lo, hi, max_guesses
        self.attempts = 20 * (hi - lo + 1)

    def task(self, secret: int) -> Task:
        """The task with this secret (from either split)."""
        prompt = (
            f"I am thinking of an integer between {self.lo} and {self.hi} inclusive. "
            f"You have {self.max_guesses} guesses. Each turn, answer with one integer, "
            f"e.g. \\boxed{{{(self.lo + self.hi) // 2}}}. I reply 'higher' if my number is "
            "larger, 'lower' if it is smaller, or 'correct'."
        )
        columns = {"secret": secret, "lo": self.lo, "hi": self.hi, "max_guesses": self.max_guesses}
        return Task(f"guess-{self.lo}-{self.hi}-{secret}", prompt, str(secret), "guess", columns)

    def draw(self, rng: random.Random) -> Task:
        return self.task(rng.randint(self.lo, self.hi))


class GuessNumberEnv(_Game):
    """Plays one number-guessing episode per `reset`.

    Rewards per turn: a valid guess earns `valid_reward` plus `narrow_reward`
    times the share of the initial interval it rules out (so shaping sums to at
    most `narrow_reward` over an episode); the right guess earns
    `success_reward` and ends the episode; an unparseable turn earns
    `-invalid_penalty` and an error observation. The episode also ends when
    the task's `max_guesses` valid guesses are used up (success False).
    """

    def __init__(
        self,
        success_reward: float = 1.0,
        narrow_reward: float = 0.2,
        valid_reward: float = 0.0,
        invalid_penalty: float = 0.1,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(invalid_penalty, system_prompt)
        self.success_reward, self.narrow_reward = success_reward, narrow_reward
        self.valid_reward = valid_reward
        self.secret = self.lo = self.hi = self.left = self.guesses = self.size = 0

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        """Start an episode on `task` (columns secret, lo, hi, max_guesses); seed is unused."""
        c = task.columns
        self.secret, self.lo, self.hi = int(c["secret"]), int(c["lo"]), int(c["hi"])
        self.left, self.guesses, self.size = int(c["max_guesses"]), 0, max(self.hi - self.lo, 1)
        return self._first(task)

    @staticmethod
    def parse_guess(text: str) -> int | None:
        """The last `\\boxed{N}` if there is one, else the last integer in `text`, else None."""
        boxed = extract_boxed(text)
        found = _INT.findall(boxed if boxed is not None else text)
        return _to_int(found[-1]) if found else None

    async def step(self, turn: AssistantTurn) -> StepResult:
        """Score one guess; see the class docstring for the rewards."""
        self._check()
        guess = self.parse_guess(turn.text)
        if guess is None:
            info = {"success": False, "guesses": self.guesses}
            return self._error("no integer found; answer with one integer, e.g. \\boxed{50}", info)
        self.guesses += 1
        self.left -= 1
        before = self.hi - self.lo
        success = guess == self.secret
        if success:
            word, self.lo, self.hi = "correct", guess, guess
        elif guess < self.secret:
            word, self.lo = "higher", max(self.lo, guess + 1)
        else:
            word, self.hi = "lower", min(self.hi, guess - 1)
        # Shaping: the share of the initial interval this guess rules out (the right
        # guess rules out the rest), so it sums to at most narrow_reward.
        reward = self.valid_reward + self.narrow_reward * (before - (self.hi - self.lo)) / self.size
        reward += self.success_reward if success else 0.0
        self._done = success or self.left <= 0
        text = word if success else f"{word}. {self.left or 'No'} guesses left."
        info = {"success": success, "guesses": self.guesses}
        message = {"role": "user", "content": text}
        return StepResult([message], reward, self._done, info, {"guesses": 1.0})


_GUESS_OPTIONS = {
    "range": [1, 100], "max_guesses": 7, "success_reward": 1.0, "narrow_reward": 0.2,
    "valid_reward": 0.0, "invalid_penalty": 0.1, "system_prompt": None, "eval_size": 100,
}  # fmt: skip


def guess_number_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for `env.type = "guess_number"`.

    Options (defaults): range ([1, 100]), max_guesses (7), success_reward (1.0),
    narrow_reward (0.2), valid_reward (0.0), invalid_penalty (0.1),
    system_prompt (None), eval_size (100; fewer if the range holds fewer).
    """
    o = _options(options, _GUESS_OPTIONS, "guess_number")
    bounds = o["range"]
    if (
        not isinstance(bounds, list | tuple)
        or len(bounds) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        or bounds[0] >= bounds[1]
    ):
        raise ConfigError(
            f"env.options.range must be [lo, hi] integers with lo < hi, got {bounds!r}"
        )
    gen = GuessNumberTasks(bounds[0], bounds[1], o["max_guesses"])
    heldout = gen.heldout(o["eval_size"])
    try:
        gen.sample(random.Random(seed), 1)
    except ValueError:
        heldout = []
    if not heldout:
        raise ConfigError(f"env.options.range {bounds!r} is too small for a train/held-out split")
    keys = ("success_reward", "narrow_reward", "valid_reward", "invalid_penalty", "system_prompt")
    return EnvSpec(
        make_env=lambda task: GuessNumberEnv(**{k: o[k] for k in keys}),
        train=ProceduralSampler(gen, seed),
        heldout=heldout,
        name="guess_number",
    )


# ----------------------------------------------------------------------------- wordle


def wordle_feedback(guess: str, secret: str) -> str:
    """One mark per letter: `G` right place, `Y` elsewhere in the secret, `_` absent.

    A letter guessed more often than the secret holds it gets `Y` only while
    unmatched copies remain (greens are matched first), as in Wordle.
    """
    marks = ["G" if g == s else "_" for g, s in zip(guess, secret, strict=True)]
    spare: dict[str, int] = {}
    for g, s in zip(guess, secret, strict=True):
        if g != s:
            spare[s] = spare.get(s, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] == "_" and spare.get(g, 0) > 0:
            marks[i], spare[g] = "Y", spare[g] - 1
    return "".join(marks)


class WordleTasks(_SecretTasks):
    """Wordle tasks: secret uniform over `WORDS`, split by a hash of the word."""

    salt = "temper-wordle-v1:"
    attempts = 50 * len(WORDS)

    def __init__(self, max_guesses: int = 6) -> None:
        self.max_guesses = max_guesses

    def task(self, secret: str) -> Task:
        """The task with this secret (from either split)."""
        prompt = (
            f"Guess my secret 5-letter English word in {self.max_guesses} guesses. Each turn, "
            "answer with one word, e.g. \\boxed{crane}. For each letter I reply G (right "
            "place), Y (in the word, elsewhere) or _ (not in the word)."
        )
        columns = {"secret": secret, "max_guesses": self.max_guesses}
        return Task(f"wordle-{secret}", prompt, secret, "wordle", columns)

    def draw(self, rng: random.Random) -> Task:
        return self.task(rng.choice(WORDS))


class WordleEnv(_Game):
    """Plays one Wordle episode per `reset`.

    Rewards per turn: `green_reward` times the share of the 5 positions that
    turn green for the first time in this episode; solving adds
    `success_reward` and ends the episode. A guess of the wrong length or not
    in `WORDS` earns `-invalid_penalty` and an error observation, and does not
    count as a guess. The episode also ends after the task's `max_guesses`
    valid guesses (success False).
    """

    def __init__(
        self,
        success_reward: float = 1.0,
        green_reward: float = 1.0,
        invalid_penalty: float = 0.1,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(invalid_penalty, system_prompt)
        self.success_reward, self.green_reward = success_reward, green_reward
        self.secret, self.greens, self.left, self.guesses = "", set[int](), 0, 0

    async def reset(self, task: Task, seed: int | None = None) -> list[Message]:
        """Start an episode on `task` (columns secret, max_guesses); seed is unused."""
        self.secret = str(task.columns["secret"]).lower()
        self.left, self.guesses, self.greens = int(task.columns["max_guesses"]), 0, set()
        return self._first(task)

    @staticmethod
    def parse_guess(text: str) -> str | None:
        """The last `\\boxed{...}`'s letters if any, else the last run of letters, lowercased."""
        boxed = extract_boxed(text)
        found = _LETTERS.findall(boxed if boxed is not None else text)
        if boxed is not None:
            return "".join(found).lower() or None
        return found[-1].lower() if found else None

    async def step(self, turn: AssistantTurn) -> StepResult:
        """Score one guess; see the class docstring for the rewards."""
        self._check()
        guess = self.parse_guess(turn.text)
        info = {"success": False, "guesses": self.guesses}
        if guess is None:
            return self._error("no word found; answer with one 5-letter word", info)
        if len(guess) != 5:
            return self._error(f"'{guess}' has {len(guess)} letters; guess a 5-letter word", info)
        if guess not in _WORD_SET:
            return self._error(f"'{guess}' is not in the word list", info)
        self.guesses += 1
        self.left -= 1
        marks = wordle_feedback(guess, self.secret)
        new = {i for i, m in enumerate(marks) if m == "G"} - self.greens
        self.greens |= new
        solved = guess == self.secret
        reward = self.green_reward * len(new) / 5 + (self.success_reward if solved else 0.0)
        self._done = solved or self.left <= 0
        left = f"{self.left} guesses left" if self.left else "no guesses left"
        text = f"{guess.upper()} {marks} ({'solved' if solved else left})"
        info = {"success": solved, "guesses": self.guesses}
        message = {"role": "user", "content": text}
        return StepResult([message], reward, self._done, info, {"guesses": 1.0})


_WORDLE_OPTIONS = {
    "max_guesses": 6, "success_reward": 1.0, "green_reward": 1.0, "invalid_penalty": 0.1,
    "system_prompt": None, "eval_size": 100,
}  # fmt: skip


def wordle_spec(options: dict[str, Any], seed: int) -> EnvSpec:
    """Spec factory for `env.type = "wordle"`.

    Options (defaults): max_guesses (6), success_reward (1.0), green_reward
    (1.0), invalid_penalty (0.1), system_prompt (None), eval_size (100; at
    most the held-out share of `WORDS`: 59 words).
    """
    o = _options(options, _WORDLE_OPTIONS, "wordle")
    gen = WordleTasks(o["max_guesses"])
    keys = ("success_reward", "green_reward", "invalid_penalty", "system_prompt")
    return EnvSpec(
        make_env=lambda task: WordleEnv(**{k: o[k] for k in keys}),
        train=ProceduralSampler(gen, seed),
        heldout=gen.heldout(o["eval_size"]),
        name="wordle",
    )
