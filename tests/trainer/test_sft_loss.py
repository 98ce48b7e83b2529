"""trainer.mode = "sft": the loss is the NLL per assistant token, computed by hand here,
and the packed path gives the unpacked one's loss and gradients."""

import copy
import math

import pytest
import torch
from tests.trainer.loss_grads import summed_loss_and_grads

from fp32 import SAME_MATH
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.data.conversations import Conversation, ConversationRenderer, arithmetic_conversations
from temper.models import load_model, load_tokenizer
from temper.trainer.batching import MicroBatch
from temper.trainer.packing import PackedMicroBatch
from temper.trainer.policy_trainer import PolicyTrainer

TWO_TURNS = Conversation(
    "two-turns",
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "\\boxed{5}"},
        {"role": "user", "content": "And 4 + 4?"},
        {"role": "assistant", "content": "4+4=8. \\boxed{8}"},
    ],
)


def _sft_trainer(**trainer):
    cfg = TrainerConfig(mode="sft", warmup_steps=0, **trainer)
    return PolicyTrainer(load_model("tiny"), cfg, AlgoConfig(), 10, pad_id=0)


def test_rendered_conversation_marks_exactly_the_assistant_turns():
    tok = load_tokenizer("tiny")
    t = ConversationRenderer(tok).render(TWO_TURNS)
    text = tok.decode(t.prompt_ids)
    assert text.endswith("<|im_start|>assistant\n") and "What is 2 + 3?" in text
    marked = tok.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m])
    assert marked == "\\boxed{5}<|im_end|>4+4=8. \\boxed{8}<|im_end|>"
    unmarked = tok.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if not m])
    assert unmarked == "\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n"


def test_sft_loss_is_the_hand_computed_nll_of_the_assistant_tokens():
    tok = load_tokenizer("tiny")
    t = ConversationRenderer(tok).render(TWO_TURNS)
    trainer = _sft_trainer(lr=1e-12)
    # By hand: one plain forward over prompt + response; token j of the response is
    # predicted at position len(prompt) - 1 + j; only loss-masked tokens count.
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(input_ids=ids).logits[0].double(), -1)
    p = len(t.prompt_ids)
    nll = [-float(logp[p - 1 + j, tok_id]) for j, tok_id in enumerate(t.response_ids)]
    assistant = [x for x, m in zip(nll, t.loss_mask, strict=True) if m]
    expected = sum(assistant) / len(assistant)
    every_token = sum(nll) / len(nll)
    assert not math.isclose(expected, every_token, rel_tol=1e-2)  # the mask matters here
    stats = trainer.train_step([t])
    assert stats["nll_per_token"] == pytest.approx(
        expected, rel=SAME_MATH["rtol"], abs=SAME_MATH["atol"]
    )
    assert stats["loss"] == stats["nll_per_token"]
    assert stats["train_tokens"] == len(assistant)
    assert "entropy" not in stats and "clip_frac_low" not in stats  # no RL objective ran


def test_packed_sft_equals_unpacked_within_fp32_tolerance():
    tok = load_tokenizer("tiny")
    renderer = ConversationRenderer(tok)
    convs = [TWO_TURNS, *arithmetic_conversations(6, seed=4)]
    base = [renderer.render(c) for c in convs]
    budget = 96  # several packed rows, several padded micro-batches
    loss_p, grads_p, kinds_p, plan_p = summed_loss_and_grads(
        _sft_trainer(micro_batch_tokens=budget, packing=True), copy.deepcopy(base)
    )
    loss_u, grads_u, kinds_u, _ = summed_loss_and_grads(
        _sft_trainer(micro_batch_tokens=budget), copy.deepcopy(base)
    )
    assert kinds_p == {PackedMicroBatch} and kinds_u == {MicroBatch} and len(plan_p) > 1
    assert loss_p == pytest.approx(loss_u, rel=SAME_MATH["rtol"], abs=SAME_MATH["atol"])
    for name, g in grads_u.items():
        rel = float((grads_p[name] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 1e-5, (name, rel)


@pytest.mark.slow
def test_sft_steps_lower_the_nll_they_train_on():
    tok = load_tokenizer("tiny")
    renderer = ConversationRenderer(tok)
    batch = [renderer.render(c) for c in arithmetic_conversations(4, levels=[4], seed=1)]
    trainer = _sft_trainer(lr=1e-3, mini_batches=2)
    first = trainer.train_step(copy.deepcopy(batch))
    for _ in range(2):
        last = trainer.train_step(copy.deepcopy(batch))
    assert last["nll_per_token"] < first["nll_per_token"]
