"""Per-task statistics and the adaptive task samplers (targeted, curriculum, weighted)."""

import json
import random
from collections import Counter

import pytest

from temper.builder.tasks import build_sampler
from temper.config import config_from_dict
from temper.config.sampler import SamplerConfig
from temper.data.arithmetic import ArithmeticTasks
from temper.data.sampler import ListSampler, ProceduralSampler
from temper.data.task_sampling import AdaptiveSampler, curriculum_weights
from temper.data.task_stats import TaskStats
from temper.errors import ConfigError, TemperError
from temper.records import Task, Trajectory


def _traj(task: Task, correct: bool) -> Trajectory:
    return Trajectory(task.id, 0, [1], [2], [1], [0.0], [0], "stop", reward=float(correct),
                      correct=correct)  # fmt: skip


def _feed(sampler: AdaptiveSampler, step: int, tasks: list[Task], pass_rate) -> None:
    """Score every task with a deterministic share of correct samples (8 per task)."""
    trajs = []
    for t in tasks:
        n_right = round(8 * pass_rate(t))
        trajs += [_traj(t, i < n_right) for i in range(8)]
    sampler.observe(step, trajs)


LEVEL_PASS = {"level1": 1.0, "level2": 0.5, "level3": 0.0, "level4": 0.0}


def _arith(type_: str = "targeted", **opts) -> AdaptiveSampler:
    gen = ArithmeticTasks(levels=(1, 2, 3, 4), seed=0)
    s = build_sampler(SamplerConfig(type=type_, **opts), ProceduralSampler(gen, 0), seed=0)
    assert isinstance(s, AdaptiveSampler)
    return s


def test_stats_posterior_decay_and_state_round_trip():
    stats = TaskStats(decay=0.5)
    stats.update(1, [("a", True), ("a", True), ("a", False)])
    assert stats.posterior("a", 1) == (3.0, 2.0)
    assert stats.posterior("a", 3) == (1.5, 1.25)  # two steps later: counts x 0.25
    assert stats.posterior("never", 3) == (1.0, 1.0)
    assert stats.keys["a"].seen == 3
    again = TaskStats()
    again.load_state_dict(json.loads(json.dumps(stats.state_dict())))
    assert again.posterior("a", 3) == stats.posterior("a", 3)
    assert stats.stddev("a", 1) < stats.stddev("a", 3)  # stale: less certain


def test_targeted_prefers_the_level_near_half_and_still_explores():
    s = _arith()
    first = s.sample(64)  # nothing known yet: every level drawn
    assert {t.category for t in first} == set(LEVEL_PASS)
    for step in range(1, 6):
        _feed(s, step, s.sample(64), lambda t: LEVEL_PASS[t.category])
    shares = Counter(t.category for t in s.sample(400))
    assert shares["level2"] > 300  # pass rate 0.5: the target (explore = 0.1)
    assert shares["level2"] < 400  # the others keep a little exploration
    assert s.metrics()["sampler/pass_rate/level1"] > 0.9


def test_targeted_over_a_task_list_picks_distinct_mid_difficulty_tasks():
    tasks = [Task(id=f"t{i}", prompt=f"q{i}", answer="1") for i in range(30)]
    rate = {t.id: (0.5 if i % 3 == 0 else float(i % 3 == 1)) for i, t in enumerate(tasks)}
    s = build_sampler(SamplerConfig(type="targeted", decay=1.0), ListSampler(tasks, 0), seed=0)
    _feed(s, 1, s.sample(30), lambda t: rate[t.id])
    for step in range(2, 6):
        _feed(s, step, tasks, lambda t: rate[t.id])
    batch = s.sample(8)
    assert len({t.id for t in batch}) == 8
    assert sum(rate[t.id] == 0.5 for t in batch) >= 7


def test_sampler_state_resumes_the_same_draws():
    a = _arith()
    for step in range(1, 4):
        _feed(a, step, a.sample(16), lambda t: LEVEL_PASS[t.category])
    state = json.loads(json.dumps(a.state_dict()))  # as state.json stores it
    b = _arith()
    b.load_state_dict(state)
    assert [t.id for t in b.sample(50)] == [t.id for t in a.sample(50)]
    with pytest.raises(TemperError, match=r"sampler\.type"):
        _arith("curriculum", schedule=[{"step": 0, "weights": {"level1": 1}}]).load_state_dict(
            state
        )
    with pytest.raises(TemperError, match=r"'targeted', the config's sampler\.type is 'uniform'"):
        ProceduralSampler(ArithmeticTasks(), 0).load_state_dict(state)


def test_curriculum_interpolates_category_weights_over_steps():
    schedule = [{"step": 1, "weights": {"level1": 1.0}}, {"step": 11, "weights": {"level3": 1.0}}]
    cfg = SamplerConfig(type="curriculum", schedule=schedule)
    assert curriculum_weights(cfg.schedule, 6) == {"level1": 0.5, "level3": 0.5}
    assert curriculum_weights(cfg.schedule, 50) == {"level3": 1.0}
    s = _arith("curriculum", schedule=schedule)
    assert {t.category for t in s.sample(40)} == {"level1"}  # step 1
    s.observe(10, [])  # step 11 is past the last point
    assert {t.category for t in s.sample(40)} == {"level3"}


def test_curriculum_over_a_dataset_walks_each_category():
    tasks = [Task(id=f"{c}{i}", prompt="q", category=c) for c in "ab" for i in range(3)]
    cfg = SamplerConfig(type="curriculum", schedule=[{"step": 0, "weights": {"b": 1.0}}])
    s = build_sampler(cfg, ListSampler(tasks, 0), seed=0)
    drawn = [t.id for t in s.sample(6)]
    assert sorted(drawn[:3]) == ["b0", "b1", "b2"] and sorted(drawn[3:]) == ["b0", "b1", "b2"]


def test_unknown_curriculum_category_is_a_one_line_config_error():
    cfg = SamplerConfig(type="curriculum", schedule=[{"step": 0, "weights": {"level7": 1.0}}])
    gen = ArithmeticTasks(levels=(1, 2), seed=0)
    with pytest.raises(ConfigError, match=r"unknown category 'level7'.*level1, level2"):
        build_sampler(cfg, ProceduralSampler(gen, 0), seed=0)


def test_weighted_sampler_calls_the_users_function(tmp_path):
    fn = tmp_path / "weights.py"
    fn.write_text(
        "def only_unsolved(arms, step):\n"
        "    return [0.0 if a['category'] == 'level1' else 1.0 for a in arms]\n"
        "def bad(arms, step):\n"
        "    return [-1.0] * len(arms)\n"
    )
    s = _arith("weighted", function=f"{fn}:only_unsolved")
    assert "level1" not in {t.category for t in s.sample(100)}
    with pytest.raises(TemperError, match="finite weights >= 0"):
        _arith("weighted", function=f"{fn}:bad").sample(1)
    with pytest.raises(TemperError, match=r"sampler.function .*missing.py.* not found"):
        _arith("weighted", function=f"{tmp_path}/missing.py:f")


def test_task_stats_need_a_task_list():
    gen = ArithmeticTasks(seed=0)
    with pytest.raises(ConfigError, match="stats_by = 'task' needs a finite task list"):
        build_sampler(SamplerConfig(type="targeted", stats_by="task"), ProceduralSampler(gen, 0), 0)

    class NoCategories:
        def sample(self, rng: random.Random, k: int):
            return []

    with pytest.raises(ConfigError, match="generator with categories"):
        build_sampler(SamplerConfig(type="targeted"), ProceduralSampler(NoCategories(), 0), 0)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"sampler": {"type": "curriculum"}}, "needs sampler.schedule"),
        ({"sampler": {"type": "weighted"}}, "needs sampler.function"),
        ({"sampler": {"function": "m:f"}}, "only used by sampler.type = 'weighted'"),
        (
            {"sampler": {"type": "curriculum", "schedule": [{"step": 0, "weights": {"a": -1}}]}},
            "weights must be >= 0",
        ),
        ({"orchestrator": {"refill": True, "max_staleness": 1}}, "synchronous runs only"),
        (
            {"orchestrator": {"refill": True, "drop_zero_variance_groups": False}},
            "needs orchestrator.drop_zero_variance_groups",
        ),
    ],
)
def test_bad_sampler_and_refill_config_is_refused(section, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(section)
