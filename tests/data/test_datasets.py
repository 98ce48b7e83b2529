"""load_tasks: every source kind, field mapping, and every error case."""

import gzip
import json
from pathlib import Path

import pytest

from temper.data.datasets import load_tasks
from temper.errors import DataError

ROWS = [
    {"question": "What is 2+2?", "solution": "2+2=4\n#### 4", "level": "easy", "uid": "a"},
    {
        "question": "What is 3*500?",
        "solution": "3*500 = 1,500\n#### 1,500",
        "level": "hard",
        "uid": "b",
    },
]
GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_defaults(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "hi", "answer": 3, "extra": [1]}])
    (task,) = load_tasks(path)
    assert task.id == "train-0"
    assert task.prompt == "hi" and task.answer == "3"
    assert task.category == "default" and task.columns == {"extra": [1]}


def test_field_mapping_and_gsm8k_extraction(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", ROWS)
    tasks = load_tasks(
        str(path),
        prompt_field="question",
        answer_field="solution",
        id_field="uid",
        category_field="level",
        answer_extractor="gsm8k",
    )
    assert [t.id for t in tasks] == ["a", "b"]
    assert [t.answer for t in tasks] == ["4", "1500"]
    assert [t.category for t in tasks] == ["easy", "hard"]
    # The raw answer and category columns are kept under their own names for TRL-style
    # reward functions.
    assert tasks[0].columns == {"solution": ROWS[0]["solution"], "level": "easy"}
    assert tasks[0].messages() == [{"role": "user", "content": "What is 2+2?"}]


def test_json_array_gz_and_chat_prompts(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    rows = [{"prompt": chat, "answer": "The sum is \\boxed{2}."}]
    array = tmp_path / "chat.json"
    array.write_text(json.dumps(rows, indent=2))
    (task,) = load_tasks(array, answer_extractor="boxed")
    assert task.prompt == chat and task.answer == "2"
    packed = tmp_path / "chat.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write(json.dumps(rows[0]) + "\n")
    assert load_tasks(packed)[0].prompt == chat


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    tasks = load_tasks(
        path, prompt_field="question", answer_field="solution", answer_extractor="gsm8k"
    )
    assert [t.answer for t in tasks] == ["4", "1500"]
    assert tasks[1].columns == {"level": "hard", "uid": "b", "solution": ROWS[1]["solution"]}
    assert tasks[1].id == "data-1"


def test_hf_dataset_and_dataset_dict():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    tasks = load_tasks(
        ds, prompt_field="question", answer_field="solution", answer_extractor="gsm8k"
    )
    assert [t.answer for t in tasks] == ["4", "1500"] and tasks[0].id == "task-0"
    dd = datasets.DatasetDict(test=ds)
    assert len(load_tasks(dd, prompt_field="question", answer_field=None, split="test")) == 2
    with pytest.raises(DataError, match=r"has splits \['test'\]; pass split="):
        load_tasks(dd, prompt_field="question")
    with pytest.raises(DataError, match="has no split 'train'"):
        load_tasks(dd, prompt_field="question", split="train")


def test_list_of_dicts_directory_split_and_custom_extractor(tmp_path):
    tasks = load_tasks(
        [{"prompt": "p", "answer": "ANSWER: 7"}], answer_extractor=lambda s: s.split(":")[1].strip()
    )
    assert tasks[0].answer == "7" and tasks[0].id == "task-0"
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "p", "answer": "1"}])
    assert load_tasks(tmp_path, split="test")[0].id == "test-0"
    assert load_tasks([{"prompt": "p"}], answer_field=None)[0].answer is None
    with pytest.raises(DataError, match=r"row 0: field 'answer' gave no answer \(answer_extractor"):
        load_tasks([{"prompt": "p", "answer": "x"}], answer_extractor=lambda s: None)


@pytest.mark.parametrize(
    ("content", "name", "kwargs", "message"),
    [
        (None, "absent.jsonl", {}, "dataset file not found: .*absent.jsonl"),
        (
            "a,b\n1,2\n",
            "data.csv",
            {},
            "data.csv: unsupported file type; use .jsonl, .json or .parquet",
        ),
        ("", "empty.jsonl", {}, "empty.jsonl: dataset is empty"),
        (
            '{"prompt": "a", "answer": "1"}\n\n{"prompt": "b",\n',
            "bad.jsonl",
            {},
            "bad.jsonl: bad JSON on line 3: ",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n[1, 2]\n',
            "arr.jsonl",
            {},
            "arr.jsonl line 2: expected a JSON object, got list",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n',
            "miss.jsonl",
            {},
            r"miss.jsonl line 2: missing field 'prompt' \(available: answer, question\)",
        ),
        (
            '{"prompt": "a"}\n',
            "noans.jsonl",
            {},
            r"line 1: missing field 'answer' \(available: prompt\)",
        ),
        (
            '{"prompt": "a", "answer": "7"}\n',
            "g.jsonl",
            {"answer_extractor": "gsm8k"},
            "line 1: field 'answer' has no '#### <answer>' line",
        ),
        (
            '{"prompt": 5, "answer": "7"}\n',
            "p.jsonl",
            {},
            "line 1: field 'prompt' must be a string or a non-empty list of chat messages, got int",
        ),
        ('{"prompt": "  ", "answer": "7"}\n', "blank.jsonl", {}, "line 1: field 'prompt' is empty"),
        (
            '{"prompt": [{"text": "hi"}], "answer": "7"}\n',
            "m.jsonl",
            {},
            "message 0 must be a dict with 'role' and 'content'",
        ),
        (
            '{"prompt": "a", "answer": {"x": 1}}\n',
            "d.jsonl",
            {},
            "field 'answer' must be a string or a number, got dict",
        ),
        (
            '{"prompt": "a", "answer": "1", "k": 1}\n{"prompt": "b", "answer": "2", "k": 1}\n',
            "dup.jsonl",
            {"id_field": "k"},
            r"line 2: duplicate id '1' \(first seen at line 1\)",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n',
            "x.jsonl",
            {"answer_extractor": "latex"},
            "unknown answer_extractor 'latex'",
        ),
        (
            '{"prompt": "a", "answer": "1"}\n',
            "s.jsonl",
            {"split": "test"},
            "split= applies only to a directory",
        ),
    ],
)
def test_errors_are_one_clear_line(tmp_path, content, name, kwargs, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=message) as info:
        load_tasks(path, **kwargs)
    assert "\n" not in str(info.value)


def test_other_source_errors(tmp_path):
    with pytest.raises(DataError, match="is a directory; pass split="):
        load_tasks(tmp_path)
    with pytest.raises(DataError, match="no file for split 'dev'"):
        load_tasks(tmp_path, split="dev")
    with pytest.raises(DataError, match="dataset row 1 is a str, not a dict"):
        load_tasks([{"prompt": "a", "answer": "1"}, "oops"])
    with pytest.raises(DataError, match="dataset is empty"):
        load_tasks([])
    with pytest.raises(DataError, match="unsupported dataset source of type int"):
        load_tasks(42)
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DataError, match="cannot read as parquet"):
        load_tasks(bad)


@pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason=f"GSM8K not found at {GSM8K}")
def test_real_gsm8k():
    tasks = load_tasks(GSM8K / "test.jsonl", prompt_field="question", answer_extractor="gsm8k")
    assert len(tasks) == 1319
    assert tasks[0].answer == "18"
    assert tasks[0].prompt.startswith("Janet")
    assert all(t.answer and "," not in t.answer for t in tasks)
