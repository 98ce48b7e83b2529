"""Procedural arithmetic tasks: determinism, splits, answers, levels, worked solutions."""

from __future__ import annotations

import random

import pytest

from temper.data.arithmetic import (
    LEVELS,
    ArithmeticTasks,
    Problem,
    extract_boxed,
    is_correct,
    is_heldout,
    make_problem,
    mistake_for,
    solve,
    to_task,
    worked_solution,
)
from temper.records import Task


def problem_of(task: Task) -> Problem:
    c = task.columns
    return Problem(c["a"], c["op"], c["b"], c["level"])


def test_sample_is_deterministic_for_a_seed() -> None:
    a = ArithmeticTasks(levels=(1, 2, 3, 4), seed=7)
    b = ArithmeticTasks(levels=(1, 2, 3, 4), seed=7)
    assert [t.id for t in a.sample(random.Random(3), 50)] == [
        t.id for t in b.sample(random.Random(3), 50)
    ]
    assert [next(iter(a)).id for _ in range(5)] == [next(iter(b)).id for _ in range(5)]
    assert a.heldout(40) == b.heldout(40)


def test_heldout_is_fixed_distinct_and_disjoint_from_training() -> None:
    tasks = ArithmeticTasks(levels=LEVELS, seed=0)
    held = tasks.heldout(200)
    assert len(held) == 200
    assert held == ArithmeticTasks(levels=LEVELS, seed=99).heldout(200)
    texts = {t.id.split("-", 2)[2] for t in held}
    assert len(texts) == 200
    train = tasks.sample(random.Random(0), 5000)
    assert not texts & {t.id.split("-", 2)[2] for t in train}
    assert all(not is_heldout(problem_of(t)) for t in train)


def test_heldout_share_is_about_a_fifth() -> None:
    rng = random.Random(0)
    share = sum(is_heldout(make_problem(rng, 2)) for _ in range(4000)) / 4000
    assert 0.15 < share < 0.25


def test_level1_pool_is_small_and_other_levels_fill_in() -> None:
    held = ArithmeticTasks(levels=(1, 2)).heldout(100)
    assert len(held) == 100
    level1 = [t for t in held if t.category == "level1"]
    assert 5 < len(level1) < 40


@pytest.mark.parametrize("level", LEVELS)
def test_answers_are_correct_and_levels_respected(level: int) -> None:
    rng = random.Random(level)
    for _ in range(500):
        p = make_problem(rng, level)
        assert p.level == level
        assert solve(p) == p.answer == eval(p.text)
        assert p.answer >= 0
        solution = worked_solution(p)
        assert extract_boxed(solution) == str(p.answer)
        task = to_task(p)
        assert task.answer == str(p.answer)
        assert task.category == f"level{level}"
        assert task.prompt == f"What is {p.a} {p.op} {p.b}?"
        assert is_correct(task, solution)
        if level == 1:
            assert 0 <= p.a <= 9 and 0 <= p.b <= 9 and p.op == "+"
        elif level == 3:
            assert mistake_for(p) is not None and p.op in "+-"
        elif level == 4 and p.op == "*":
            assert 10 <= p.a <= 99 and 2 <= p.b <= 9
        elif level == 4:
            assert 100 <= p.a <= 999 and 100 <= p.b <= 999


def test_worked_solutions_exact_text() -> None:
    assert worked_solution(Problem(47, "+", 38, 3)) == "7+8=15, carry 1. 4+3+1=8. \\boxed{85}"
    assert worked_solution(Problem(52, "-", 38, 3)) == "12-8=4, borrow 1. 5-1-3=1. \\boxed{14}"
    assert worked_solution(Problem(47, "*", 6, 4)) == "7*6=42, carry 4. 4*6+4=28. \\boxed{282}"
    assert worked_solution(Problem(7, "+", 8, 1)) == "7+8=15. \\boxed{15}"
    assert worked_solution(Problem(52, "-", 48, 3)).endswith("\\boxed{4}")


def test_mistakes_are_systematic_and_wrong() -> None:
    add, sub, mul = Problem(47, "+", 38, 3), Problem(52, "-", 38, 3), Problem(47, "*", 6, 4)
    assert worked_solution(add, "forget_carry") == "7+8=15. 4+3=7. \\boxed{75}"
    assert worked_solution(sub, "no_borrow") == "8-2=6. 5-3=2. \\boxed{26}"
    assert worked_solution(mul, "forget_carry") == "7*6=42. 4*6=24. \\boxed{242}"
    assert mistake_for(Problem(41, "+", 38, 2)) is None
    assert mistake_for(add) == "forget_carry" and mistake_for(sub) == "no_borrow"
    with pytest.raises(ValueError):
        worked_solution(add, "no_borrow")
    with pytest.raises(ValueError):
        worked_solution(add, "typo")


def test_is_correct_parses_last_box() -> None:
    task = to_task(Problem(2, "+", 3, 1))
    assert is_correct(task, "2+3=5. \\boxed{5}")
    assert is_correct(task, "\\boxed{4} no, \\boxed{ 5 }")
    assert not is_correct(task, "2+3=5.")
    assert not is_correct(task, "\\boxed{five}")


def test_bad_levels_raise() -> None:
    with pytest.raises(ValueError):
        ArithmeticTasks(levels=(0,))
    with pytest.raises(ValueError):
        make_problem(random.Random(0), 5)
