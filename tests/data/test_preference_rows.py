"""Preference pairs for DPO: bad rows give one-line errors naming the row and the field;
a pair renders as two trajectories with one prompt and the loss on the answer only."""

import json

import pytest

from temper.data.conversations import ConversationRenderer
from temper.data.preference_rows import load_preference_rows, render_pair, tiny_rm_rows
from temper.errors import DataError
from temper.models import load_tokenizer

GOOD = {"prompt": "What is 2 + 2?", "chosen": "\\boxed{4}", "rejected": "\\boxed{5}"}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"prompt": "hi", "chosen": "yo"}, "line 2: missing field 'rejected' (available: "),
        ({"prompt": "hi", "rejected": "yo"}, "line 2: missing field 'chosen'"),
        ({"chosen": "a", "rejected": "b"}, "line 2: missing field 'prompt'"),
        ({**GOOD, "rejected": 5}, "line 2: field 'rejected' must be a string or a non-empty"),
        ({**GOOD, "chosen": ""}, "line 2: field 'chosen' is empty"),
        ({**GOOD, "rejected": None}, "line 2: field 'rejected' is null"),
        (
            {**GOOD, "rejected": [{"role": "user", "content": "x"}]},
            "line 2: field 'rejected' must start with an assistant message",
        ),
        (
            {**GOOD, "chosen": [{"content": "x"}]},
            "line 2: field 'chosen' message 0 must be a dict with a 'role'",
        ),
        (
            {**GOOD, "prompt": [{"role": "assistant", "content": "x"}]},
            "line 2: field 'prompt' ends with an assistant message",
        ),
    ],
)
def test_bad_rows_name_the_row_and_the_field(tmp_path, row, problem):
    path = _write(tmp_path / "prefs.jsonl", [GOOD, row])
    with pytest.raises(DataError) as err:
        load_preference_rows(str(path))
    assert str(err.value).startswith(f"{path} {problem}")
    assert "\n" not in str(err.value)


def test_strings_and_messages_and_other_field_names(tmp_path):
    row = {
        "q": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "good": [{"role": "assistant", "content": "Hello."}],
        "bad": "Go away.",
    }
    rows = load_preference_rows(str(_write(tmp_path / "p.jsonl", [row])), "q", "good", "bad")
    assert rows[0].id == "p-0" and rows[0].prompt == row["q"]
    assert rows[0].chosen == row["good"]
    assert rows[0].rejected == [{"role": "assistant", "content": "Go away."}]


def test_tiny_rm_rows_are_plain_prompts_split_by_content():
    train = tiny_rm_rows(200, heldout=False, seed=0)
    heldout = tiny_rm_rows(100, heldout=True, seed=0)
    assert all("<|im_start|>" not in r.prompt[0]["content"] for r in train + heldout)
    assert {r.prompt[0]["content"] for r in train}.isdisjoint(
        {r.prompt[0]["content"] for r in heldout}
    )
    assert all(r.chosen != r.rejected for r in train)


def _masked_text(tok, t):
    return tok.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m])


def test_a_pair_shares_its_prompt_and_trains_on_the_answers_only():
    tok = load_tokenizer("tiny")
    renderer = ConversationRenderer(tok)
    row = tiny_rm_rows(1, heldout=False, seed=0)[0]
    chosen, rejected = render_pair(renderer, row, 7)
    assert chosen.prompt_ids == rejected.prompt_ids
    assert chosen.prompt_key() == rejected.prompt_key()
    assert (chosen.group_id, chosen.task_id) == (7, row.id)
    assert tok.decode(chosen.prompt_ids).endswith("<|im_start|>assistant\n")
    assert _masked_text(tok, chosen).startswith(row.chosen[0]["content"])
    assert _masked_text(tok, rejected).startswith(row.rejected[0]["content"])


def test_a_prompt_with_history_is_all_prompt(tmp_path):
    tok = load_tokenizer("tiny")
    history = [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "\\boxed{2}"},
        {"role": "user", "content": "And 2 + 2?"},
    ]
    path = _write(tmp_path / "h.jsonl", [{"prompt": history, "chosen": "4", "rejected": "5"}])
    row = load_preference_rows(str(path))[0]
    for renderer in (ConversationRenderer(tok), ConversationRenderer(tok, "Be brief.")):
        chosen, rejected = render_pair(renderer, row, 0)
        assert "\\boxed{2}" in tok.decode(chosen.prompt_ids)
        assert _masked_text(tok, chosen) == "4<|im_end|>"
        assert _masked_text(tok, rejected) == "5<|im_end|>"


def test_a_pair_longer_than_the_context_is_refused():
    tok = load_tokenizer("tiny")
    row = tiny_rm_rows(1, heldout=False, seed=0)[0]
    with pytest.raises(DataError, match="longer than the model context"):
        render_pair(ConversationRenderer(tok), row, 0, max_tokens=5)
