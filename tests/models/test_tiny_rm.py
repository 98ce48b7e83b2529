"""The built-in tiny reward model: files, loading by alias, and its held-out accuracy."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from temper.data.preferences import make_pairs
from temper.models import TINY_RM_DIR, resolve_model_path
from temper.rewards.rm_batcher import load_reward_model

#: The accuracy the shipped model must reach on held-out pairs it was never trained on.
MIN_ACCURACY = 0.9


@pytest.fixture(scope="module")
def metrics() -> dict:
    return json.loads((TINY_RM_DIR / "rm_metrics.json").read_text())


def test_shipped_files_alias_and_size(metrics: dict) -> None:
    assert resolve_model_path("tiny-rm") == TINY_RM_DIR
    assert resolve_model_path("builtin:tiny-rm") == TINY_RM_DIR
    weights = TINY_RM_DIR / "model.safetensors"
    assert weights.is_file() and weights.stat().st_size < 10 * 2**20
    config = json.loads((TINY_RM_DIR / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert metrics["accuracy"] >= MIN_ACCURACY and metrics["n"] >= 500


def test_pair_encoding_ends_with_end_of_turn() -> None:
    tok = AutoTokenizer.from_pretrained(TINY_RM_DIR)
    ids = tok("What is 2 + 3?", "2+3=5. \\boxed{5}")["input_ids"]
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token_id != ids[-1]  # the pooled last token is never padding


def test_heldout_accuracy_recomputed(metrics: dict) -> None:
    """Score a held-out slice from scratch: chosen above rejected at the recorded rate."""
    model = AutoModelForSequenceClassification.from_pretrained(TINY_RM_DIR).eval()
    tok = AutoTokenizer.from_pretrained(TINY_RM_DIR)
    assert model.config.num_labels == 1
    pairs = make_pairs(metrics["n"], heldout=True, seed=metrics["args"]["seed"])[:256]
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    enc = tok(prompts, responses, padding=True, return_tensors="pt")
    with torch.inference_mode():
        r = model(**enc).logits[:, 0]
    accuracy = (r[: len(pairs)] > r[len(pairs) :]).float().mean().item()
    assert accuracy >= MIN_ACCURACY
    assert accuracy == pytest.approx(metrics["accuracy"], abs=0.05)


def test_load_reward_model_by_alias() -> None:
    model, tok = load_reward_model("tiny-rm")
    assert model.config.num_labels == 1 and not model.training
    assert tok.pad_token_id == model.config.pad_token_id
