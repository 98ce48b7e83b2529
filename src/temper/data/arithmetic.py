"""Procedural arithmetic tasks with short worked solutions.

Problems come in four difficulty levels:

- level 1: one-digit a + b (`7 + 8`)
- level 2: two-digit a + b or a - b, uniform (about half need a carry or borrow)
- level 3: two-digit a + b that needs a carry, or two-digit a - b that needs a borrow
- level 4: three-digit a + b or a - b (uniform), or two-digit a * one-digit b

The prompt is the user message (`What is 47 + 38?`). The expected response is a
short column-by-column worked solution that ends with `\\boxed{N}`::

    7+8=15, carry 1. 4+3+1=8. \\boxed{85}
    12-8=4, borrow 1. 5-1-3=1. \\boxed{14}
    7*6=42, carry 4. 4*6+4=28. \\boxed{282}

`worked_solution(problem, mistake)` can also write the solution a careless
student would: `"forget_carry"` (+ and *: the carry is never added to the next
column) or `"no_borrow"` (-: each column subtracts the smaller digit from the
larger one). `solve(problem, mistake)` gives the number such a solution ends
with. The tiny model's pretraining corpus uses these to plant systematic errors
that RL can then remove.

Every problem belongs to exactly one split, decided by a stable hash of its
canonical text (`47+38`): about 20% are held out. `ArithmeticTasks.sample` never
yields a held-out problem; `ArithmeticTasks.heldout` yields only held-out ones.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from temper.records import Task
from temper.rewards.answers import extract_boxed

LEVELS: tuple[int, ...] = (1, 2, 3, 4)
DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 3)
MISTAKES: tuple[str, ...] = ("forget_carry", "no_borrow")

#: Share of all problems in the held-out split, in percent.
HELDOUT_PERCENT = 20
_SPLIT_SALT = "temper-arith-v1:"


@dataclass(frozen=True)
class Problem:
    """`a op b` at a difficulty level. `op` is one of `+`, `-`, `*`."""

    a: int
    op: str
    b: int
    level: int

    @property
    def text(self) -> str:
        """Canonical form without spaces, e.g. `47+38`. Decides the split."""
        return f"{self.a}{self.op}{self.b}"

    @property
    def prompt(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    @property
    def answer(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b


def is_heldout(problem: Problem) -> bool:
    """True if the problem is in the held-out split (stable across runs and machines)."""
    digest = hashlib.sha256((_SPLIT_SALT + problem.text).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def make_problem(rng: random.Random, level: int) -> Problem:
    """Draw one problem of `level` (1..4) from `rng`, from either split."""
    if level == 1:
        return Problem(rng.randint(0, 9), "+", rng.randint(0, 9), 1)
    if level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < 0.5:
            return Problem(a, "+", b, 2)
        return Problem(max(a, b), "-", min(a, b), 2)
    if level == 3:
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if rng.random() < 0.5:
                if a % 10 + b % 10 >= 10:
                    return Problem(a, "+", b, 3)
            elif max(a, b) % 10 < min(a, b) % 10:
                return Problem(max(a, b), "-", min(a, b), 3)
    if level == 4:
        kind = rng.randrange(3)
        if kind == 2:
            return Problem(rng.randint(10, 99), "*", rng.randint(2, 9), 4)
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if kind == 0:
            return Problem(a, "+", b, 4)
        return Problem(max(a, b), "-", min(a, b), 4)
    raise ValueError(f"arithmetic level must be one of {LEVELS}, got {level}")


def _digits(n: int, width: int) -> list[int]:
    """Digits of n, least significant first, zero-padded to `width`."""
    return [(n // 10**i) % 10 for i in range(width)]


def _add_steps(p: Problem, forget: bool) -> tuple[list[str], int]:
    width = max(len(str(p.a)), len(str(p.b)))
    xs, ys = _digits(p.a, width), _digits(p.b, width)
    steps, out, carry = [], "", 0
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        total = x + y + carry
        expr = f"{x}+{y}+{carry}" if carry else f"{x}+{y}"
        last = i == width - 1
        if last:
            steps.append(f"{expr}={total}.")
            out = str(total) + out
        elif total >= 10 and not forget:
            steps.append(f"{expr}={total}, carry 1.")
            out = str(total % 10) + out
        else:
            steps.append(f"{expr}={total}.")
            out = str(total % 10) + out
        carry = 1 if total >= 10 and not forget else 0
    return steps, int(out)


def _sub_steps(p: Problem, no_borrow: bool) -> tuple[list[str], int]:
    width = len(str(p.a))
    xs, ys = _digits(p.a, width), _digits(p.b, width)
    steps, out, borrow = [], "", 0
    for x, y in zip(xs, ys, strict=True):
        if no_borrow:
            hi, lo = max(x, y), min(x, y)
            steps.append(f"{hi}-{lo}={hi - lo}.")
            out = str(hi - lo) + out
            continue
        expr = f"-{borrow}-{y}" if borrow else f"-{y}"
        if x - borrow < y:
            diff = 10 + x - borrow - y
            steps.append(f"1{x}{expr}={diff}, borrow 1.")
            borrow = 1
        else:
            diff = x - borrow - y
            steps.append(f"{x}{expr}={diff}.")
            borrow = 0
        out = str(diff) + out
    return steps, int(out)


def _mul_steps(p: Problem, forget: bool) -> tuple[list[str], int]:
    width = len(str(p.a))
    xs = _digits(p.a, width)
    steps, out, carry = [], "", 0
    for i, x in enumerate(xs):
        total = x * p.b + carry
        expr = f"{x}*{p.b}+{carry}" if carry else f"{x}*{p.b}"
        last = i == width - 1
        if last:
            steps.append(f"{expr}={total}.")
            out = str(total) + out
        elif total >= 10 and not forget:
            steps.append(f"{expr}={total}, carry {total // 10}.")
            out = str(total % 10) + out
        else:
            steps.append(f"{expr}={total}.")
            out = str(total % 10) + out
        carry = total // 10 if not forget else 0
    return steps, int(out)


def mistake_for(problem: Problem) -> str | None:
    """The mistake that would change this problem's answer, or None if none would.

    `"forget_carry"` for + and * problems with a carry between columns,
    `"no_borrow"` for - problems with a borrow.
    """
    if problem.op == "-":
        return "no_borrow" if solve(problem, "no_borrow") != problem.answer else None
    return "forget_carry" if solve(problem, "forget_carry") != problem.answer else None


def _steps(problem: Problem, mistake: str | None) -> tuple[list[str], int]:
    if mistake not in (None, *MISTAKES):
        raise ValueError(f"unknown mistake {mistake!r}; expected None or one of {MISTAKES}")
    if problem.op == "+":
        if mistake == "no_borrow":
            raise ValueError("mistake 'no_borrow' applies to subtraction only")
        return _add_steps(problem, mistake == "forget_carry")
    if problem.op == "-":
        if mistake == "forget_carry":
            raise ValueError("mistake 'forget_carry' applies to + and * only")
        return _sub_steps(problem, mistake == "no_borrow")
    if problem.op == "*":
        if mistake == "no_borrow":
            raise ValueError("mistake 'no_borrow' applies to subtraction only")
        return _mul_steps(problem, mistake == "forget_carry")
    raise ValueError(f"unknown operator {problem.op!r}")


def solve(problem: Problem, mistake: str | None = None) -> int:
    """The final answer the worked solution (with `mistake`, if any) arrives at."""
    return _steps(problem, mistake)[1]


def worked_solution(problem: Problem, mistake: str | None = None) -> str:
    """The short worked solution, ending with `\\boxed{N}`.

    With `mistake` set, the steps follow that faulty procedure and the boxed
    answer is the (wrong) number it leads to.
    """
    steps, result = _steps(problem, mistake)
    return " ".join([*steps, f"\\boxed{{{result}}}"])


def is_correct(task: Task, completion: str) -> bool:
    """True if the completion's last boxed answer equals the task's integer answer."""
    got = extract_boxed(completion)
    if got is None or task.answer is None:
        return False
    try:
        return int(got) == int(task.answer)
    except ValueError:
        return False


def to_task(problem: Problem) -> Task:
    """The Task for a problem: user prompt, integer answer, `category="level{d}"`."""
    return Task(
        id=f"arith-l{problem.level}-{problem.text}",
        prompt=problem.prompt,
        answer=str(problem.answer),
        category=f"level{problem.level}",
        columns={"level": problem.level, "op": problem.op, "a": problem.a, "b": problem.b},
    )


class ArithmeticTasks:
    """A stream of training tasks and a fixed held-out list, over the given levels.

    `sample(rng, k)` draws k training-split tasks (level uniform over `levels`);
    `heldout(n, seed)` returns the same list of n distinct held-out tasks every
    time. Iterating yields an endless training stream seeded by `seed`.
    """

    def __init__(self, levels: Sequence[int] = DEFAULT_LEVELS, seed: int = 0) -> None:
        levels = tuple(levels)
        if not levels or any(lv not in LEVELS for lv in levels):
            raise ValueError(
                f"arithmetic levels must be a non-empty subset of {LEVELS}, got {levels}"
            )
        self.levels = levels
        self.seed = seed
        self._rng = random.Random(seed)

    def sample_problem(self, rng: random.Random | None = None) -> Problem:
        """One training-split problem."""
        rng = rng if rng is not None else self._rng
        level = rng.choice(self.levels)
        while True:
            problem = make_problem(rng, level)
            if not is_heldout(problem):
                return problem

    def sample(self, rng: random.Random | None = None, k: int = 1) -> list[Task]:
        """k training-split tasks drawn from `rng` (the instance's own stream if None)."""
        return [to_task(self.sample_problem(rng)) for _ in range(k)]

    @property
    def categories(self) -> tuple[str, ...]:
        """The task categories, one per level: `"level1"`, ... (for task samplers)."""
        return tuple(f"level{lv}" for lv in self.levels)

    def sample_in(self, rng: random.Random, category: str) -> Task:
        """One training-split task of `category` (one of `categories`)."""
        if category not in self.categories:
            raise ValueError(f"unknown arithmetic category {category!r}; have {self.categories}")
        level = int(category.removeprefix("level"))
        while True:
            problem = make_problem(rng, level)
            if not is_heldout(problem):
                return to_task(problem)

    def __iter__(self) -> Iterator[Task]:
        while True:
            yield to_task(self.sample_problem())

    def heldout_problems(self, n: int = 300, seed: int = 1234) -> list[Problem]:
        """n distinct held-out problems, levels interleaved round-robin.

        A level whose held-out pool runs out (level 1 has only about 20
        problems) stops contributing and the other levels fill the rest.
        """
        rng = random.Random(seed)
        active = list(self.levels)
        seen: set[str] = set()
        out: list[Problem] = []
        while len(out) < n and active:
            for level in list(active):
                if len(out) >= n:
                    break
                for _ in range(2000):
                    problem = make_problem(rng, level)
                    if problem.text not in seen and is_heldout(problem):
                        seen.add(problem.text)
                        out.append(problem)
                        break
                else:
                    active.remove(level)
        return out

    def heldout(self, n: int = 300, seed: int = 1234) -> list[Task]:
        """The fixed held-out task list (same n and seed give the same list)."""
        return [to_task(p) for p in self.heldout_problems(n, seed)]
