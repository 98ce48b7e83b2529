"""Base models (no chat template): ``model.chat_template`` = auto | raw | chatml | a file."""

import json
import shutil
from pathlib import Path

import pytest

from quick_run import metrics, train
from temper.builder.model import load_run_model
from temper.cli.main import main
from temper.config import config_from_dict
from temper.errors import ConfigError
from temper.models import TINY_DIR, load_tokenizer
from temper.models.chat_template import CHATML_TEMPLATE, IncrementalRenderer
from temper.models.templates import install_chat_template, start_text

SHORT = (
    "--orchestrator.steps=3",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=2",
    "--orchestrator.drop_zero_variance_groups=false",
    "--log.trajectories_per_step=4",
)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The built-in tiny model without its chat template: a base model."""
    path = tmp_path_factory.mktemp("models") / "base"
    shutil.copytree(TINY_DIR, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(path).chat_template is None
    return path


def _errors(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("temper:")]


def _prompt_texts(run: Path) -> list[str]:
    lines = (run / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt_text"] for line in lines]


def test_auto_without_a_template_is_one_line_and_exit_2(base, tmp_path, capsys):
    code = main(["train", f"--model.path={base}", f"--run.output_dir={tmp_path}", *SHORT])
    lines = _errors(capsys)
    assert code == 2 and len(lines) == 1
    assert "has no chat template" in lines[0] and 'model.chat_template = "raw"' in lines[0]
    assert not (tmp_path / "demo" / "metrics.jsonl").exists()  # refused before the run


def test_raw_trains_a_base_model(base, tmp_path):
    run = train(tmp_path, "raw", f"--model.path={base}", "--model.chat_template=raw", *SHORT)
    steps = metrics(run)
    assert [m["step"] for m in steps] == [1, 2, 3] and all("loss" in m for m in steps)
    texts = _prompt_texts(run)
    assert texts and all(t.startswith("What is") and "<|im_start|>" not in t for t in texts)


def test_a_named_template_trains_a_base_model(base, tmp_path):
    run = train(tmp_path, "chatml", f"--model.path={base}", "--model.chat_template=chatml", *SHORT)
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]
    assert all(t.startswith("<|im_start|>user\n") for t in _prompt_texts(run))


def test_raw_renders_plain_text_and_episodes_turn_by_turn(base):
    tokenizer = load_tokenizer(base)
    install_chat_template(tokenizer, "raw", str(base))
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = tokenizer.apply_chat_template(system, add_generation_prompt=True, tokenize=False)
    assert text == "Be brief.\n\n2+3?"
    # Multi-turn: a sampled turn ends with eos, the next observation follows a blank line.
    turns = IncrementalRenderer(tokenizer)
    assert turns.end_of_turn_ids == [tokenizer.eos_token_id] and turns.separator_ids == []
    new = turns.observation([{"role": "user", "content": "and 4+4?"}])
    assert tokenizer.decode(new) == "\n\nand 4+4?"
    # An assistant message (SFT) is its content and eos, the part the mask marks.
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    enc = tokenizer.apply_chat_template(
        chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    marked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(marked) == "a" + tokenizer.eos_token


class _BosTokenizer:
    """Adds id 1 (``<s>``) before every text, as Llama's tokenizers do."""

    def __call__(self, text, add_special_tokens=True):
        ids = [ord(c) for c in text]
        return {"input_ids": [1, *ids] if add_special_tokens else ids}

    def convert_ids_to_tokens(self, ids):
        return ["<s>" if i == 1 else chr(i) for i in ids]


def test_raw_starts_with_the_tokens_the_tokenizer_adds(base):
    assert start_text(_BosTokenizer()) == "<s>"
    assert start_text(load_tokenizer(base)) == ""


def test_a_template_file(base, tmp_path):
    tokenizer = load_tokenizer(base)
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    install_chat_template(tokenizer, str(good), str(base))
    chat = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == "[hi]"
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    cases = {
        str(tmp_path / "missing.jinja"): "cannot read",
        str(bad): "cannot render a user message",
        "llama9": "neither 'auto', 'raw', 'chatml' nor a path to a .jinja file",
    }
    for setting, words in cases.items():
        with pytest.raises(ConfigError, match=words) as info:
            install_chat_template(load_tokenizer(base), setting, str(base))
        assert "\n" not in str(info.value)


class _PlainVocab:
    def get_vocab(self):
        return {"a": 0, "b": 1}


def test_chatml_needs_its_tokens():
    with pytest.raises(ConfigError, match=r"needs the tokens <\|im_start\|>, <\|im_end\|>"):
        install_chat_template(_PlainVocab(), "chatml", "m")


def test_builtin_templates_and_auto(base):
    tokenizer = load_tokenizer(base)
    install_chat_template(tokenizer, "chatml", str(base))
    assert tokenizer.chat_template == CHATML_TEMPLATE
    shipped = load_tokenizer("tiny")
    install_chat_template(shipped, "auto", "tiny")  # its own template: kept
    assert shipped.chat_template == load_tokenizer("tiny").chat_template


def test_a_server_may_load_a_base_model_under_auto(base):
    cfg = config_from_dict({"model": {"path": str(base)}})
    with pytest.raises(ConfigError, match="has no chat template"):
        load_run_model(cfg)
    assert load_run_model(cfg, prompts=False).tokenizer.chat_template is None
