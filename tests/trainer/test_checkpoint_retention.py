"""When checkpoints are written (`Cadence`) and which are kept: the newest
``keep`` and the best held-out step (`mark_best`)."""

import json

from test_checkpoint import _model, _Tok

from temper.config import Config
from temper.trainer.checkpoint import (
    Cadence,
    best_checkpoint,
    list_checkpoints,
    mark_best,
    save_checkpoint,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_default_config_checkpoints_by_wall_time_and_keeps_the_best():
    c = Config().checkpoint
    assert (c.every, c.every_minutes, c.keep, c.keep_best) == (0, 10.0, 2, True)


def test_cadence_by_steps_by_minutes_and_off():
    clock = _Clock()
    by_time = Cadence(every=0, every_minutes=10, clock=clock)
    clock.now += 599
    assert not by_time.due(1)
    clock.now += 1
    assert by_time.due(2)
    by_time.restart()  # a checkpoint was written: count from now
    assert not by_time.due(3)
    by_steps = Cadence(every=3, every_minutes=0, clock=clock)
    clock.now += 10**6
    assert [s for s in range(1, 8) if by_steps.due(s)] == [3, 6]
    assert not any(Cadence(0, 0, clock).due(s) for s in range(1, 10))


def test_pruning_keeps_the_newest_and_the_best(tmp_path):
    model = _model()

    def save(step: int) -> None:
        save_checkpoint(tmp_path, step, model, _Tok(), {}, {"version": step}, keep=2)

    save(1)
    save(2)
    mark_best(tmp_path, 2, 0.5, keep=2)
    for step in (3, 4, 5):
        save(step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2", "step_4", "step_5"]
    assert best_checkpoint(tmp_path) == {"step": 2, "accuracy": 0.5}
    # A new best frees the old one, which is no longer among the newest two.
    mark_best(tmp_path, 5, 0.75, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_4", "step_5"]
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 5
    assert not list(tmp_path.glob(".best.json*"))  # written atomically, nothing left over


def test_a_missing_or_torn_best_mark_is_no_mark(tmp_path):
    assert best_checkpoint(tmp_path) is None
    (tmp_path / "best.json").write_text('{"step": ')
    assert best_checkpoint(tmp_path) is None
