"""Each bad input gives one line naming the problem, exit code 2, no traceback."""

import json
import subprocess
import sys

import pytest

from temper.cli.main import main

FAST = [
    "--orchestrator.steps=1",
    "--eval.at_start=false",
    "--eval.at_end=false",
    "--log.progress=false",
    "--checkpoint.at_end=false",
]


def _run(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in err if line.startswith("temper:")]


def test_unknown_config_key(capsys, tmp_path):
    code, lines = _run(capsys, ["train", "--trainer.lrr=1", f"--run.output_dir={tmp_path}"])
    assert code == 2
    assert lines == [
        "temper: error: invalid config: unknown config key 'trainer.lrr' (did you mean 'lr'?)"
    ]


def test_wrong_type(capsys, tmp_path):
    code, lines = _run(capsys, ["train", "--orchestrator.steps=many"])
    assert code == 2 and len(lines) == 1
    assert "orchestrator.steps" in lines[0] and "'many'" in lines[0]


def test_unknown_key_in_toml_file(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[trainer]\nlearning_rate = 1e-4\n")
    code, lines = _run(capsys, ["train", str(cfg)])
    assert code == 2 and "unknown config key 'trainer.learning_rate'" in lines[0]


def test_missing_model_path(capsys, tmp_path):
    code, lines = _run(
        capsys, ["train", f"--model.path={tmp_path}/nope", f"--run.output_dir={tmp_path}", *FAST]
    )
    assert code == 2 and len(lines) == 1
    assert f"{tmp_path}/nope" in lines[0]


def _dataset(tmp_path, rows):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dataset_missing_field(capsys, tmp_path):
    path = _dataset(tmp_path, [{"question": "What is 1 + 1?", "answer": "2"}] * 10)
    code, lines = _run(
        capsys,
        ["train", "--data.type=file", f"--data.path={path}", f"--run.output_dir={tmp_path}", *FAST],
    )
    assert code == 2 and len(lines) == 1
    assert "'prompt'" in lines[0] and "question" in lines[0]


def test_empty_dataset(capsys, tmp_path):
    path = _dataset(tmp_path, [])
    code, lines = _run(
        capsys,
        ["train", "--data.type=file", f"--data.path={path}", f"--run.output_dir={tmp_path}", *FAST],
    )
    assert code == 2 and len(lines) == 1 and "empty" in lines[0]


def test_prompt_longer_than_context(capsys, tmp_path):
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}] * 9
    rows.append({"prompt": "seven " * 3000, "answer": "7"})
    path = _dataset(tmp_path, rows)
    code, lines = _run(
        capsys,
        [
            "train",
            "--data.type=file",
            f"--data.path={path}",
            f"--data.eval_path={path}",
            f"--run.output_dir={tmp_path}",
            *FAST,
        ],
    )
    assert code == 2 and len(lines) == 1
    assert "longer than the model context" in lines[0]


def test_existing_run_dir_is_not_overwritten(capsys, tmp_path):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "metrics.jsonl").write_text("{}\n")
    code, lines = _run(capsys, ["train", f"--run.output_dir={tmp_path}"])
    assert code == 2 and "already exists" in lines[0]
    assert (tmp_path / "demo" / "metrics.jsonl").read_text() == "{}\n"


def test_no_traceback_from_the_real_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "temper.cli.main", "train", "--trainer.lr=abc"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "temper: error: invalid config: trainer.lr: Input should be a valid number, "
        "unable to parse string as a number (got 'abc')"
    ]


@pytest.mark.parametrize("arg", ["positional", "--nodot=1"])
def test_bad_override_syntax(capsys, arg):
    code, lines = (
        _run(capsys, ["train", "cfg.toml", arg])
        if arg == "positional"
        else _run(capsys, ["train", arg])
    )
    assert code == 2 and len(lines) == 1


@pytest.mark.slow  # two `temper` processes (the in-process cases are in tests/config)
@pytest.mark.parametrize(
    ("content", "override", "words"),
    [
        (b'[run]\nname = "caf\xe9"\n', None, "not UTF-8"),
        (None, "--env.options.x=" + "{a=" * 3000 + "1" + "}" * 3000, "deeper than"),
    ],
)
def test_hostile_config_through_the_real_command(tmp_path, content, override, words):
    """The installed entry point: one `temper: error:` line, exit 2, no traceback."""
    args = [sys.executable, "-m", "temper.cli.main", "train"]
    if content is not None:
        path = tmp_path / "c.toml"
        path.write_bytes(content)
        args.append(str(path))
    else:
        args.append(override)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("temper: error: ") and words in lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--sampler.type=weighted", "--sampler.function=nope/w.py:weigh"],
            ["sampler.function 'nope/w.py:weigh'", "not found"],
        ),
        (
            ["{toml}"],
            ["unknown category 'level9'", "level1, level2, level3"],
        ),
        (
            ["--orchestrator.refill=true", "--orchestrator.max_staleness=2"],
            ["orchestrator.refill", "synchronous runs only"],
        ),
    ],
)
def test_bad_sampler_and_refill_settings(capsys, tmp_path, args, words):
    toml = tmp_path / "curriculum.toml"
    toml.write_text(
        '[sampler]\ntype = "curriculum"\n[[sampler.schedule]]\nstep = 0\n'
        "weights = { level1 = 1.0, level9 = 1.0 }\n"
    )
    args = [a.replace("{toml}", str(toml)) for a in args]
    code, lines = _run(capsys, ["train", *args, f"--run.output_dir={tmp_path}", *FAST])
    assert code == 2 and len(lines) == 1, lines
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "demo").exists()  # nothing written before the check
