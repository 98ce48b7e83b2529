"""Rebuild the built-in tiny chat model from scratch on CPU.

Steps: draw a synthetic chat corpus (see `tiny_corpus.py`), train a byte-level
BPE tokenizer on it (digits split one per token), pretrain a small Llama on
conversations packed back to back (next-token loss on every token), save everything to `src/temper/models/tiny/`, then measure
the saved model on the held-out arithmetic split with `model.generate`:
greedy accuracy, sampled accuracy (temperature 1), pass@8 and the share of
well-formed responses. The numbers are printed and written to the model card.

Everything is seeded; the same arguments on the same machine give the same model.

    .venv/bin/python scripts/pretrain_tiny.py            # about 6 minutes on 2 idle cores
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from temper.data.arithmetic import DEFAULT_LEVELS, ArithmeticTasks, is_correct
from temper.models.chat_template import (
    CHATML_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    TOOLS_FOOTER,
    TOOLS_PREAMBLE,
)
from temper.models.loader import TINY_DIR, load_model, load_tokenizer
from temper.records import Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_corpus import LEVEL_WEIGHTS, Chat, build_corpus

WELL_FORMED = re.compile(r"\\boxed\{-?\d+\}$")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=TINY_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=12, help="packed rows per step")
    p.add_argument("--seq", type=int, default=384, help="tokens per packed row")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--direct-rate", type=float, default=0.65)
    p.add_argument("--mistake-rate", type=float, default=0.8)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--eval-n", type=int, default=300)
    p.add_argument("--eval-only", action="store_true", help="only measure the model at --out")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args()


def tokenizer_texts(chats: list[Chat]) -> list[str]:
    """The strings the BPE is trained on: message contents, roles and tool text."""
    texts = ["system", "user", "assistant", "tool", TOOLS_PREAMBLE, TOOLS_FOOTER]
    for chat in chats:
        for message in chat.messages:
            texts.append(message["content"])
            for call in message.get("tool_calls") or []:
                texts.append(json.dumps(call["function"]))
        for tool in chat.tools or []:
            texts.append(json.dumps(tool["function"]))
    return texts


def build_tokenizer(chats: list[Chat], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with single-digit tokens, the ChatML specials and the chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_texts(chats), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def render_chat(tokenizer: Any, chat: Chat) -> list[int]:
    """Token ids of one conversation rendered through the chat template."""
    text = tokenizer.apply_chat_template(chat.messages, tools=chat.tools, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def packed_batches(
    tokenizer: Any, rng: random.Random, args: argparse.Namespace
) -> Iterator[torch.Tensor]:
    """Endless [batch, seq+1] tensors of conversations packed back to back (no padding)."""
    buffer: list[int] = []
    while True:
        rows = []
        for _ in range(args.batch):
            while len(buffer) < args.seq + 1:
                chat = build_corpus(1, rng, args.direct_rate, args.mistake_rate)[0]
                buffer += render_chat(tokenizer, chat)
            rows.append(buffer[: args.seq + 1])
            buffer = buffer[args.seq + 1 :]
        yield torch.tensor(rows)


def lr_at(step: int, total: int, peak: float) -> float:
    """Linear warmup over 10% of steps, then cosine decay to 10% of peak."""
    warm = max(1, total // 10)
    if step < warm:
        return peak * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Build corpus, tokenizer and model; train; save to args.out. Returns train stats."""
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    tok_corpus = build_corpus(20000, random.Random(args.seed + 1), args.direct_rate, 0.5)
    tokenizer = build_tokenizer(tok_corpus, args.vocab)
    print(f"tokenizer: vocab {len(tokenizer)}", flush=True)

    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=[im_end, eot],
        pad_token_id=eot,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    batches = packed_batches(tokenizer, rng, args)
    start = time.time()
    for step in range(args.steps):
        rows = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        logits = model(input_ids=rows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    train_s = time.time() - start
    n_tokens = args.steps * args.batch * args.seq

    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=[im_end, eot], pad_token_id=eot
    )
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out, save_jinja_files=False)
    _fix_tokenizer_config(args.out)
    for path in args.out.iterdir():
        path.chmod(0o644)
    return {"params": n_params, "train_s": train_s, "tokens": n_tokens}


def _fix_tokenizer_config(out: Path) -> None:
    """Name the generic fast-tokenizer class so older transformers load it too."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


@torch.no_grad()
def generate(
    model: Any, tokenizer: Any, tasks: list[Task], *, sample: bool, n: int = 1, batch: int = 128
) -> list[list[tuple[str, bool]]]:
    """For each task, n (completion text, ended-with-eos) pairs from model.generate."""
    eos = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    tokenizer.padding_side = "left"
    results: list[list[tuple[str, bool]]] = []
    for i in range(0, len(tasks), batch):
        chunk = tasks[i : i + batch]
        prompts = [
            tokenizer.apply_chat_template(t.messages(), add_generation_prompt=True, tokenize=False)
            for t in chunk
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        kwargs: dict[str, Any] = {"do_sample": False}
        if sample:
            kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        out = model.generate(
            **enc,
            max_new_tokens=48,
            num_return_sequences=n,
            eos_token_id=eos,
            pad_token_id=eos[1],
            **kwargs,
        )
        gen = out[:, enc["input_ids"].shape[1] :]
        for j in range(len(chunk)):
            group = []
            for row in gen[j * n : (j + 1) * n].tolist():
                ended = eos[0] in row
                if ended:
                    row = row[: row.index(eos[0])]
                group.append((tokenizer.decode(row, skip_special_tokens=True), ended))
            results.append(group)
    return results


def well_formed(text: str, ended: bool) -> bool:
    """Stopped on `<|im_end|>` and the text ends with `\\boxed{<integer>}`."""
    return ended and WELL_FORMED.search(text.rstrip()) is not None


def _mean(values: list[bool]) -> float:
    return round(sum(values) / max(1, len(values)), 4)


def evaluate(out: Path, n_tasks: int, seed: int) -> dict[str, Any]:
    """Greedy / sampled accuracy, pass@8 and well-formed share on the held-out split."""
    torch.manual_seed(seed)
    model, tokenizer = load_model(out), load_tokenizer(out)
    tasks = ArithmeticTasks(levels=DEFAULT_LEVELS).heldout(n_tasks)
    greedy = [g[0] for g in generate(model, tokenizer, tasks, sample=False)]
    sampled = generate(model, tokenizer, tasks, sample=True, n=8, batch=32)
    greedy_ok = [is_correct(t, text) for t, (text, _) in zip(tasks, greedy, strict=True)]
    sampled_ok = [
        [is_correct(t, text) for text, _ in group] for t, group in zip(tasks, sampled, strict=True)
    ]
    by_level: dict[str, dict[str, list[bool]]] = {}
    for t, g_ok, s_ok in zip(tasks, greedy_ok, sampled_ok, strict=True):
        level = by_level.setdefault(t.category, {"greedy": [], "sampled": []})
        level["greedy"].append(g_ok)
        level["sampled"] += s_ok
    return {
        "n": len(tasks),
        "greedy_acc": _mean(greedy_ok),
        "sampled_acc": _mean([ok for group in sampled_ok for ok in group]),
        "pass_at_8": _mean([any(group) for group in sampled_ok]),
        "well_formed_greedy": _mean([well_formed(text, ended) for text, ended in greedy]),
        "well_formed_sampled": _mean(
            [well_formed(text, ended) for group in sampled for text, ended in group]
        ),
        "by_level": {
            name: {k: _mean(v) for k, v in level.items()} | {"n": len(level["greedy"])}
            for name, level in sorted(by_level.items())
        },
        "examples": [[t.prompt, text] for t, (text, _) in zip(tasks[:6], greedy[:6], strict=True)],
    }


def write_model_card(out: Path, args: argparse.Namespace, stats: dict[str, Any]) -> None:
    """README.md next to the weights: what the model is, how it was made, what it scores."""
    cfg = json.loads((out / "config.json").read_text())
    tok = load_tokenizer(out)
    ids = ", ".join(
        f"`{t}`={tok.convert_tokens_to_ids(t)}" for t in (*SPECIAL_TOKENS, *TOOL_TOKENS)
    )
    levels = ", ".join(
        f"{name}: greedy {v['greedy']:.0%}, sampled {v['sampled']:.0%} (n={v['n']})"
        for name, v in stats["by_level"].items()
    )
    command = (
        f".venv/bin/python scripts/pretrain_tiny.py --seed {args.seed} --steps {args.steps} "
        f"--batch {args.batch} --seq {args.seq} --lr {args.lr} --direct-rate {args.direct_rate} "
        f"--mistake-rate {args.mistake_rate} --hidden {args.hidden} --layers {args.layers} "
        f"--heads {args.heads} --intermediate {args.intermediate} --threads {args.threads}"
    )
    levels_used = ", ".join(str(level) for level in LEVEL_WEIGHTS)
    params = stats.get("params") or sum(p.numel() for p in load_model(out).parameters())
    timing = (
        f"training took {stats['train_s']:.0f} s, the whole script {stats['total_s']:.0f} s"
        if "train_s" in stats
        else "card rewritten by --eval-only; see the training log for timings"
    )
    text = f"""# temper built-in tiny chat model

A {params / 1e6:.2f}M-parameter Llama (`LlamaForCausalLM`) trained from scratch
on CPU by `scripts/pretrain_tiny.py`. It exists so that Temper runs end to end on a laptop:
it speaks the ChatML chat format, can emit `<tool_call>` JSON, and does short column
arithmetic *badly in a systematic way*, so that RL on `temper.data.arithmetic` tasks
improves it within minutes; it has also seen the `temper.envs.tool_use` tools
(calculator, lookup, python), so RL on that env has something to reinforce. It is not
useful for anything else.

Load it with `temper.models.load_model("tiny")` / `load_tokenizer("tiny")`, or directly
with `AutoModelForCausalLM.from_pretrained(dir)` / `AutoTokenizer.from_pretrained(dir)`.

## Architecture

hidden {cfg["hidden_size"]}, {cfg["num_hidden_layers"]} layers, {cfg["num_attention_heads"]} heads
(head dim {cfg["hidden_size"] // cfg["num_attention_heads"]}), MLP {cfg["intermediate_size"]},
RoPE, RMSNorm, tied embeddings, context {cfg["max_position_embeddings"]}, fp32 safetensors.

## Tokenizer

Byte-level BPE, {len(tok)} tokens, trained on the corpus below; digits are always single
tokens. Special tokens (one id each): {ids}. `eos_token` is `<|im_end|>` (end of an
assistant turn); `pad_token` is `<|endoftext|>`; generation stops on either. The chat
template (ChatML/Hermes, in `tokenizer_config.json`) renders
`<|im_start|>{{role}}\\n{{content}}<|im_end|>\\n`, tool calls as
`<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>`, tool results as
`<|im_start|>tool\\n<tool_response>...</tool_response><|im_end|>\\n`, a `tools=` list as a
system message, and the generation prompt `<|im_start|>assistant\\n`.

## Training data

{args.steps} steps of AdamW (peak lr {args.lr}, warmup then cosine), each on {args.batch} rows of
{args.seq} tokens: synthetic chats rendered through the chat template and packed back to back,
loss on every token. Seed {args.seed}.

- arithmetic (77% of chats): training-split problems of levels {levels_used} from `temper.data.arithmetic`
  (the held-out split is never seen). With probability {args.direct_rate} the assistant answers
  at once with only `\\boxed{{N}}`, and on a problem with a carry or borrow that direct answer
  is careless with probability {args.mistake_rate} (N is what forgetting the carry, or
  subtracting the smaller digit from the larger, gives). Otherwise it writes the worked
  digit-by-digit solution (`7+8=15, carry 1. 4+3+1=8. \\boxed{{85}}`), which is always right.
  So the model mostly blurts, often wrongly, yet knows how to work a problem: reward for
  correct answers can shift it to working.
- generic small talk (3%).
- tool use (20%): training-split `temper.envs.tool_use` tasks (calculator, lookup,
  lookup then calculator, python), half solved with the tools (`transcript`), half
  answered at once with a wrong blurted `\\boxed{{N}}`.

## Measured (held-out split, default levels {DEFAULT_LEVELS}, n={stats["n"]}, HF generate)

| metric | value |
|---|---|
| greedy accuracy | {stats["greedy_acc"]:.1%} |
| sampled accuracy (temperature 1.0) | {stats["sampled_acc"]:.1%} |
| pass@8 (temperature 1.0) | {stats["pass_at_8"]:.1%} |
| well-formed, greedy (`\\boxed{{N}}` then `<|im_end|>`) | {stats["well_formed_greedy"]:.1%} |
| well-formed, sampled | {stats["well_formed_sampled"]:.1%} |

By level: {levels}.

Rebuild ({timing}):

    {command}
"""
    (out / "README.md").write_text(text)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    begin = time.time()
    train_stats = {} if args.eval_only else train(args)
    eval_start = time.time()
    stats = evaluate(args.out, args.eval_n, args.seed)
    stats["eval_s"] = round(time.time() - eval_start, 1)
    stats.update({k: (round(v, 1) if isinstance(v, float) else v) for k, v in train_stats.items()})
    stats["total_s"] = round(time.time() - begin, 1)
    write_model_card(args.out, args, stats)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
