"""SFT conversations: bad rows and paths give one-line errors naming the row and field
(exit code 2 from `temper train`, before the run directory is made)."""

import json

import pytest

from temper.cli.main import main
from temper.data.arithmetic import Problem, is_heldout, solve
from temper.data.conversations import arithmetic_conversations, load_conversations
from temper.errors import DataError

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"prompt": "hi"}, "line 2: missing field 'messages' (available: prompt)"),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            "line 2: field 'messages' has no assistant message",
        ),
        ({"messages": []}, "line 2: field 'messages' must be a non-empty list"),
        (
            {"messages": [{"content": "hi"}, {"role": "assistant", "content": "yo"}]},
            "line 2: field 'messages' message 0 must be a dict with a 'role'",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
            "line 2: field 'messages' message 1 has no text 'content'",
        ),
        (
            {"messages": [{"role": "assistant", "content": "yo"}]},
            "line 2: field 'messages' starts with an assistant message",
        ),
    ],
)
def test_bad_rows_name_the_row_and_the_field(tmp_path, row, problem):
    path = _write(tmp_path / "convs.jsonl", [GOOD, row])
    with pytest.raises(DataError) as err:
        load_conversations(str(path))
    assert str(err.value).startswith(f"{path} {problem}")
    assert "\n" not in str(err.value)


def test_another_messages_field_and_ids(tmp_path):
    path = _write(tmp_path / "chats.jsonl", [{"chat": GOOD["messages"]}] * 2)
    convs = load_conversations(str(path), "chat")
    assert [c.id for c in convs] == ["chats-0", "chats-1"]
    assert convs[0].messages == GOOD["messages"]


def test_arithmetic_conversations_are_correct_training_split_problems():
    convs = arithmetic_conversations(50, levels=[1, 2, 3], seed=2)
    assert len(convs) == 50
    for c in convs:
        question, answer = c.messages[0]["content"], c.messages[1]["content"]
        a, op, b = question.removeprefix("What is ").removesuffix("?").split()
        problem = Problem(int(a), op, int(b), 0)
        assert not is_heldout(problem)
        assert answer.endswith(f"\\boxed{{{solve(problem)}}}")
        assert solve(problem) == problem.answer


def _train(tmp_path, *extra):
    return main(
        [
            "train",
            "--trainer.mode=sft",
            "--sft.source=file",
            f"--run.output_dir={tmp_path / 'runs'}",
            "--log.progress=false",
            "--eval.at_start=false",
            *extra,
        ]
    )


def test_cli_refuses_a_bad_row_with_exit_2_and_one_line(tmp_path, capsys):
    path = _write(tmp_path / "convs.jsonl", [GOOD, GOOD, {"text": "no messages"}])
    assert _train(tmp_path, f"--sft.path={path}") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"temper: error: {path} line 3: missing field 'messages' (available: text)"
    assert not (tmp_path / "runs" / "demo").exists()  # nothing written for a run that never ran


def test_cli_refuses_a_missing_file_and_a_missing_path(tmp_path, capsys):
    assert _train(tmp_path, f"--sft.path={tmp_path / 'nope.jsonl'}") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"temper: error: dataset file not found: {tmp_path / 'nope.jsonl'}"
    assert _train(tmp_path) == 2
    assert "sft.path is required when sft.source = 'file'" in capsys.readouterr().err
