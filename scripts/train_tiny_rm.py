"""Train the built-in tiny reward model (`temper/models/tiny_rm/`) with a Bradley-Terry loss.

The model is a `LlamaForSequenceClassification` with one label whose backbone
starts from the built-in tiny policy (`temper/models/tiny/`); only the score
head starts from scratch. Its tokenizer is the tiny tokenizer with one change:
every encoding ends with `<|im_end|>` (``tokenizer(prompt, response)`` gives
prompt + response + `<|im_end|>`), so the model reads the score off the same
end-of-turn token whatever the response is.

Data: `temper.data.preferences` (synthetic arithmetic and helpfulness pairs;
the held-out pairs share no problem or topic with the training pairs). Loss:
``-logsigmoid(r_chosen - r_rejected)``, AdamW with warmup and cosine decay.
After training it prints the held-out pairwise accuracy (share of pairs with
r_chosen > r_rejected), overall and per family, and writes it to
``rm_metrics.json`` next to the weights. Seeded: the same arguments give the
same model.

    .venv/bin/python scripts/train_tiny_rm.py [--out src/temper/models/tiny_rm]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers.processors import TemplateProcessing
from transformers import AutoModelForSequenceClassification

from temper.data.preferences import PreferencePair, make_pairs
from temper.models import TINY_DIR, load_tokenizer

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "temper" / "models" / "tiny_rm"


def rm_tokenizer():
    """The tiny tokenizer, changed to end every encoding with `<|im_end|>`."""
    tok = load_tokenizer("tiny")
    end = "<|im_end|>"
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"$A {end}",
        pair=f"$A $B:1 {end}:1",
        special_tokens=[(end, tok.convert_tokens_to_ids(end))],
    )
    return tok


def rewards(model, tok, prompts: list[str], responses: list[str]) -> torch.Tensor:
    """One padded forward; the scalar reward of each (prompt, response)."""
    enc = tok(prompts, responses, padding=True, return_tensors="pt")
    return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]


def pair_rewards(model, tok, batch: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen, r_rejected) of a batch, both halves in one forward."""
    prompts = [p.prompt for p in batch] * 2
    responses = [p.chosen for p in batch] + [p.rejected for p in batch]
    r = rewards(model, tok, prompts, responses)
    return r[: len(batch)], r[len(batch) :]


@torch.inference_mode()
def evaluate(model, tok, pairs: list[PreferencePair], batch: int = 64) -> dict:
    """Held-out pairwise accuracy, overall and per family (ties count as wrong)."""
    model.eval()
    right: dict[str, list[bool]] = defaultdict(list)
    for i in range(0, len(pairs), batch):
        chunk = pairs[i : i + batch]
        rc, rr = pair_rewards(model, tok, chunk)
        for pair, ok in zip(chunk, (rc > rr).tolist(), strict=True):
            right[pair.family].append(ok)
    every = [ok for oks in right.values() for ok in oks]
    return {
        "accuracy": sum(every) / len(every),
        "n": len(every),
        "by_family": {f: round(sum(v) / len(v), 4) for f, v in sorted(right.items())},
        "n_by_family": {f: len(v) for f, v in sorted(right.items())},
    }


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    tok = rm_tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(
        TINY_DIR, num_labels=1, pad_token_id=tok.pad_token_id, dtype=torch.float32
    )
    train_pairs = make_pairs(args.train_pairs, heldout=False, seed=args.seed)
    heldout_pairs = make_pairs(args.heldout_pairs, heldout=True, seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.monotonic()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        idx = torch.randint(len(train_pairs), (args.batch,), generator=gen).tolist()
        rc, rr = pair_rewards(model, tok, [train_pairs[i] for i in idx])
        loss = -F.logsigmoid(rc - rr).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            acc = (rc > rr).float().mean().item()
            print(f"step {step:4d} loss {loss.item():.4f} batch acc {acc:.2f}", flush=True)
    train_s = time.monotonic() - start
    metrics = evaluate(model, tok, heldout_pairs)
    metrics.update(train_seconds=round(train_s, 1), args=vars(args) | {"out": None})
    save(model, tok, Path(args.out), metrics)
    return metrics


def save(model, tok, out: Path, metrics: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = ["LlamaForSequenceClassification"]
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "rm_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--batch", type=int, default=24, help="pairs per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--train-pairs", type=int, default=20000)
    ap.add_argument("--heldout-pairs", type=int, default=1000)
    # One thread: on a shared 2-core box two OpenMP threads made a step ~7x slower.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    metrics = train(args)
    print(json.dumps({k: metrics[k] for k in ("accuracy", "n", "by_family", "train_seconds")}))


if __name__ == "__main__":
    main()
