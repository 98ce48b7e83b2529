import random

from temper.data.sampler import ListSampler, ProceduralSampler
from temper.records import Task


def _tasks(n):
    return [Task(id=str(i), prompt=f"q{i}", answer=str(i)) for i in range(n)]


def test_list_sampler_epochs_cover_every_task_once():
    s = ListSampler(_tasks(5), seed=1)
    first = [t.id for t in s.sample(5)]
    second = [t.id for t in s.sample(5)]
    assert sorted(first) == sorted(second) == [str(i) for i in range(5)]
    assert first != second  # reshuffled per epoch


def test_list_sampler_state_round_trip():
    a = ListSampler(_tasks(7), seed=3)
    a.sample(4)
    state = a.state_dict()
    expected = [t.id for t in a.sample(9)]
    b = ListSampler(_tasks(7), seed=3)
    b.load_state_dict(state)
    assert [t.id for t in b.sample(9)] == expected


class _Gen:
    def sample(self, rng: random.Random, k: int):
        return [Task(id=str(rng.random()), prompt="x") for _ in range(k)]


def test_procedural_sampler_state_round_trip():
    a = ProceduralSampler(_Gen(), seed=5)
    a.sample(3)
    state = a.state_dict()
    expected = [t.id for t in a.sample(4)]
    b = ProceduralSampler(_Gen(), seed=5)
    b.load_state_dict(state)
    assert [t.id for t in b.sample(4)] == expected
