"""A distillation teacher behind `temper serve` (``distill.teacher = URL``): the
orchestrator asks the server for the sampled tokens' logprobs (echo, max_tokens = 0),
the trainer holds no teacher, and a teacher equal to the student gives a reverse KL
of ~0 and the student's own held-out accuracy; a served teacher with another
tokenizer, one that does not answer and a VLM student are one line, exit 2."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import pytest

from distill_helpers import SHORT, swapped_digits_model
from temper.cli.main import main


@contextmanager
def served(model: str):
    """`temper serve --model MODEL` on a free port; yields its base URL. The server
    prints the URL once it accepts connections, so reading that line is the wait."""
    # Its log goes to a file: an unread stderr pipe would fill and stall the server.
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "temper.cli.main", "serve", "--model", model, "--port",
             "0", "--served-model-name", "teacher"],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        try:
            # The URL line is the condition; 120 s its deadline (a server that never
            # starts fails here instead of hanging the suite).
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, "temper serve printed no URL in 120 s"
            line = proc.stdout.readline()
            if " at http://127.0.0.1:" not in line:
                log.seek(0)
                raise AssertionError(f"temper serve did not start: {line!r} {log.read()[-2000:]}")
            yield line.rsplit(" at ", 1)[1].strip()
        finally:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def teacher_url():
    with served("tiny") as url:
        yield url


def _error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("temper:")]


def test_a_served_teacher_equal_to_the_student_gives_no_reverse_kl(tmp_path, teacher_url):
    code = main(
        ["train", *SHORT, f"--distill.teacher={teacher_url}", f"--run.output_dir={tmp_path}",
         "--run.name=served", "--orchestrator.steps=2", "--eval.at_end=false"]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "served"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "distill_reverse_kl" in r]
    assert len(steps) == 2
    # Step 0: the engine's logprobs against the server's forward of the same weights.
    assert abs(steps[0]["distill_reverse_kl"]) < 1e-3
    assert steps[0]["distill_teacher_logprob"] < -0.01  # real logprobs, not zeros
    # Step 1: the student moved (it trained on step 0), the served teacher did not.
    assert steps[1]["distill_reverse_kl"] != steps[0]["distill_reverse_kl"]
    trajs = [json.loads(x) for x in (run / "trajectories" / "step_000001.jsonl").read_text()
             .splitlines()]  # fmt: skip
    for t in trajs:
        assert len(t["teacher_logprobs"]) == len(t["response_ids"])
    teacher = json.loads((run / "eval" / "teacher.json").read_text())
    student = json.loads((run / "eval" / "step_000000.json").read_text())
    assert teacher["model"] == teacher_url and teacher["n_tasks"] == student["n_tasks"] == 8
    assert teacher["accuracy"] == student["accuracy"]  # the same weights, tasks and seed


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
    """The tiny model with the ids of "1" and "2" swapped in its tokenizer."""
    return swapped_digits_model(tmp_path_factory.mktemp("other") / "tiny")


def test_bad_served_teachers_are_one_line_exit_2(tmp_path, capsys, other_tokenizer, teacher_url):
    with served(str(other_tokenizer)) as url:
        code = main(["train", *SHORT, f"--run.output_dir={tmp_path}", f"--distill.teacher={url}"])
    assert code == 2
    (line,) = _error_lines(capsys)
    assert "has another tokenizer than the student: token id" in line, line
    assert "'1' to the student and '2' to the teacher" in line or "'2' to the student" in line
    cases = [
        (["--distill.teacher=http://127.0.0.1:9/v1"], "does not list its models"),
        ([f"--distill.teacher={teacher_url}", "--distill.teacher_model=other"],
         "distill.teacher_model 'other' is not served"),
        ([f"--distill.teacher={teacher_url}", "--model.path=tiny-vlm", "--data.type=visual"],
         "a served teacher scores token ids only"),
        (["--distill.teacher=tiny", "--distill.teacher_model=x"], "names the model of a URL"),
    ]  # fmt: skip
    for args, words in cases:
        code = main(["train", *SHORT, f"--run.output_dir={tmp_path}", *args])
        assert code == 2, args
        lines = _error_lines(capsys)
        assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "demo").exists()
