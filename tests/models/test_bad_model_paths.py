"""A model path that is not a model is refused in one whole line, exit 2 through the CLI."""

import shutil
from pathlib import Path

import pytest

from temper.cli.main import main
from temper.errors import ModelLoadError
from temper.models import TINY_DIR, load_model, load_tokenizer


def _missing(tmp: Path) -> Path:
    return tmp / "nope"


def _file(tmp: Path) -> Path:
    (tmp / "weights.bin").write_bytes(b"\0")
    return tmp / "weights.bin"


def _empty(tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _no_tokenizer(tmp: Path) -> Path:
    (tmp / "weights").mkdir()
    shutil.copy(TINY_DIR / "config.json", tmp / "weights")
    return tmp / "weights"


def _corrupt_config(tmp: Path) -> Path:
    shutil.copytree(TINY_DIR, tmp / "corrupt")
    (tmp / "corrupt" / "config.json").write_text('{"architectures": [')
    return tmp / "corrupt"


CASES = {
    "missing": (_missing, "does not exist"),
    "file": (_file, "is a file, not a model directory"),
    "empty": (_empty, "is not a model directory (no config.json)"),
    "no tokenizer": (_no_tokenizer, "has no tokenizer (none of tokenizer.json,"),
    "corrupt config": (_corrupt_config, "config.json is not valid JSON ("),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loader_says_what_is_wrong_in_one_line(case, tmp_path):
    make, words = CASES[case]
    path = make(tmp_path)
    loaders = [load_tokenizer] if case == "no tokenizer" else [load_tokenizer, load_model]
    for load in loaders:
        with pytest.raises(ModelLoadError) as info:
            load(str(path))
        message = str(info.value)
        assert words in message and repr(str(path)) in message
        assert "\n" not in message and not message.endswith(":")


def test_tokenizer_only_directory_still_loads(tmp_path):
    """An `openai` engine needs only the tokenizer: no config.json is fine."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_DIR / name, tmp_path)
    assert load_tokenizer(str(tmp_path)).eos_token == "<|im_end|>"


def test_cli_empty_directory(tmp_path, capsys):
    path = _empty(tmp_path)
    code = main(["train", f"--model.path={path}", f"--run.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("temper:")]
    assert code == 2 and "Traceback" not in err
    assert lines == [
        f"temper: error: model path {str(path)!r} is not a model directory (no config.json)"
    ]
