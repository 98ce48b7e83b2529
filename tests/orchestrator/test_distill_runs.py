"""On-policy distillation (``algo.advantage = "distill"``) on the tiny model: the
teacher's logprobs reach the trainer (a teacher equal to the student gives a reverse
KL of ~0, in single-turn, multi-turn and image runs), a student learns from a trained
teacher with one sample per prompt while its reverse KL falls, the teacher is
evaluated beside the student, async runs train, and bad teachers are one line, exit 2."""

import json
import math

import pytest

from distill_helpers import SHORT, swapped_digits_model
from temper.cli.main import main


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _steps(run):
    return [r for r in _rows(run / "metrics.jsonl") if "distill_reverse_kl" in r]


@pytest.fixture(scope="module")
def trained_teacher(tmp_path_factory):
    """A teacher that knows the task: the demo's GRPO run for 20 steps (its held-out
    greedy accuracy goes from 0.27 to about 0.95 in that time), its last checkpoint."""
    out = tmp_path_factory.mktemp("teacher")
    code = main(
        ["train", f"--run.output_dir={out}", "--run.name=teacher", "--orchestrator.steps=20",
         "--eval.at_start=false", "--eval.every=0", "--eval.size=50", "--eval.k=1",
         "--log.progress=false", "--checkpoint.keep_best=false"]
    )  # fmt: skip
    assert code == 0
    result = json.loads((out / "teacher" / "eval" / "step_000020.json").read_text())
    return out / "teacher" / "checkpoints" / "step_20", result["accuracy"]


def test_a_teacher_equal_to_the_student_gives_no_reverse_kl(tmp_path):
    code = main(
        ["train", *SHORT, "--distill.teacher=tiny", f"--run.output_dir={tmp_path}",
         "--run.name=same", "--orchestrator.steps=1", "--eval.at_end=false"]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "same"
    (step,) = _steps(run)
    # The engine's logprobs (the student's) against the same weights in the trainer.
    assert abs(step["distill_reverse_kl"]) < 1e-3
    assert step["distill_teacher_logprob"] < -0.01  # real logprobs, not zeros
    teacher = json.loads((run / "eval" / "teacher.json").read_text())
    student = json.loads((run / "eval" / "step_000000.json").read_text())
    # The same model on the same tasks with the same seed: the same greedy accuracy.
    assert teacher["model"] == "tiny" and teacher["n_tasks"] == student["n_tasks"] == 8
    assert teacher["accuracy"] == student["accuracy"]
    assert student["teacher_accuracy"] == teacher["accuracy"]  # beside the student's


def test_the_student_learns_from_a_trained_teacher_with_one_sample_per_prompt(
    tmp_path, trained_teacher
):
    teacher, teacher_accuracy = trained_teacher
    code = main(
        ["train", "--algo.advantage=distill", f"--distill.teacher={teacher}",
         f"--run.output_dir={tmp_path}", "--run.name=learn", "--orchestrator.steps=12",
         "--orchestrator.group_size=1", "--eval.size=50", "--eval.k=1", "--eval.every=0",
         "--log.progress=false", "--checkpoint.at_end=false", "--checkpoint.keep_best=false"]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "learn"
    steps = _steps(run)
    assert [r["step"] for r in steps] == list(range(1, 13))
    # Groups of one: nothing to compare within a group, yet every group trains.
    assert all(r["groups_dropped"] == 0 and r["grad_norm"] > 0 for r in steps)
    kl = [r["distill_reverse_kl"] for r in steps]
    # Per step a noisy estimate (16 samples): compare the first and the last four steps.
    first, last = sum(kl[:4]) / 4, sum(kl[-4:]) / 4
    assert first > 0.05, kl  # the untrained student is far from the teacher
    assert last < 0.5 * first, kl
    start = json.loads((run / "eval" / "step_000000.json").read_text())
    end = json.loads((run / "eval" / "step_000012.json").read_text())
    teacher_eval = json.loads((run / "eval" / "teacher.json").read_text())["accuracy"]
    # The same checkpoint and greedy tasks as the teacher run's own last eval (loaded from
    # disk here, updated in place there: one near-tie may break the other way).
    assert abs(teacher_eval - teacher_accuracy) <= 0.02
    assert end["teacher_accuracy"] == teacher_eval > start["accuracy"] + 0.3
    assert end["accuracy"] > start["accuracy"] + 0.2, (start["accuracy"], end["accuracy"])


def test_async_distillation_trains_on_stale_samples(tmp_path, trained_teacher):
    code = main(
        ["train", *SHORT, f"--distill.teacher={trained_teacher[0]}", f"--run.output_dir={tmp_path}",
         "--run.name=async", "--orchestrator.steps=3", "--orchestrator.max_staleness=1",
         "--algo.off_policy_correction=tis", "--distill.teacher_eval=false",
         "--eval.at_start=false", "--eval.at_end=false", "--distill.reward_weight=0.5"]
    )  # fmt: skip
    assert code == 0
    steps = _steps(tmp_path / "async")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["distill_reverse_kl"]) and r["grad_norm"] > 0 for r in steps)


@pytest.mark.parametrize(
    "kind, args",
    [
        # Multi-turn episodes: observation tokens (behaviour logprob 0.0, loss mask 0)
        # counted as sampled would put the teacher's logprob of each into the KL.
        ("episodes", ["--env.type=guess_number", "--env.options.max_guesses=3",
                      "--env.options.eval_size=2", "--env.limits.max_turns=3"]),
        # A vision-language student and teacher: a teacher forward without the images
        # would score the tokens of another prompt.
        ("vlm", ["--model.path=tiny-vlm", "--data.type=visual", "--data.eval_size=4"]),
    ],
)  # fmt: skip
def test_the_teacher_scores_exactly_the_sampled_tokens(tmp_path, kind, args):
    teacher = "tiny-vlm" if kind == "vlm" else "tiny"
    code = main(
        ["train", *SHORT, f"--distill.teacher={teacher}", f"--run.output_dir={tmp_path}",
         f"--run.name={kind}", "--orchestrator.steps=1", "--distill.teacher_eval=false",
         "--eval.at_start=false", "--eval.at_end=false", *args]
    )  # fmt: skip
    assert code == 0
    (step,) = _steps(tmp_path / kind)
    assert abs(step["distill_reverse_kl"]) < 1e-3
    assert step["distill_teacher_logprob"] < -0.01
    if kind == "episodes":
        assert step["env/turns_mean"] > 1  # observations were appended between turns


def _error_lines(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    return [line for line in err if line.startswith("temper:")]


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
    """The tiny model with the ids of "1" and "2" swapped in its tokenizer."""
    return swapped_digits_model(tmp_path_factory.mktemp("other") / "tiny")


def test_a_teacher_with_another_tokenizer_is_one_line_exit_2(tmp_path, capsys, other_tokenizer):
    code = main(
        ["train", *SHORT, f"--run.output_dir={tmp_path}", f"--distill.teacher={other_tokenizer}"]
    )
    assert code == 2
    (line,) = _error_lines(capsys)
    assert "has another tokenizer than the student 'tiny': 2 of the student's" in line, line
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        # One token more (<image>) is allowed; a text student is not taught by a VLM.
        (["--distill.teacher=tiny-vlm"], "is a vision-language model and the student"),
        (["--distill.teacher=/no/such/teacher"], "distill.teacher: model path '/no/such"),
        ([], "needs distill.teacher"),
        (["--algo.advantage=grpo", "--distill.teacher=tiny"], "[distill] is set but"),
        (["--distill.teacher=tiny", "--orchestrator.refill=true"], "orchestrator.refill"),
        (
            ["--distill.teacher=http://127.0.0.1:9/v1", "--distill.teacher_temperature=0.5"],
            "needs a teacher in the trainer",
        ),
        (
            ["--distill.teacher=http://127.0.0.1:9/v1", "--distill.estimator=full"],
            "distill.estimator = 'full' needs a teacher in the trainer",
        ),
        (["--distill.teacher=tiny", "--distill.estimator=whole"], "distill.estimator"),
        (
            [
                "--distill.teacher=tiny",
                "--distill.estimator=full",
                "--trainer.world_size=2",
                "--trainer.tp=2",
                "--trainer.loss_parallel=true",
            ],
            "without trainer.loss_parallel",
        ),
    ],
)
def test_bad_teachers_are_one_line_exit_2(tmp_path, capsys, args, words):
    code = main(["train", *SHORT, f"--run.output_dir={tmp_path}", *args])
    assert code == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "demo").exists()
