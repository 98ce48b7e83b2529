"""Build the built-in tiny vision-language model (LLaVA) and pretrain it on CPU.

Steps: take the built-in tiny chat model (`temper/models/tiny`) as the language model,
add an `<image>` token, put a small CLIP vision tower (64x64 pictures, 16x16 patches: 16
image tokens) and LLaVA's two-layer projector in front of it, then train, supervised, on
procedurally rendered tasks from `temper.data.visual` (count, number, redder,
same_colour) and `temper.envs.visual_grid` (the best move from a picture): stage 1 the
tower alone, as a classifier of the answers (`pretrain_tower`); stage 2 the whole model
on conversations, loss on assistant tokens only. Stage 2 is stopped early on purpose, so
that the model is only partly competent and RL has room to improve it. The result is saved (weights, tokenizer, chat template, processor) to
`src/temper/models/tiny_vlm/` and measured on held-out tasks with greedy and sampled
`model.generate`; the numbers are printed and written to the model card.

Everything is seeded; the same arguments on the same machine give the same model.

    .venv/bin/python scripts/pretrain_tiny_vlm.py            # about 4 minutes on 2 shared cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken
from transformers import (
    AutoTokenizer,
    CLIPVisionConfig,
    GenerationConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from temper.data.visual import SIZE, VisualTasks, is_correct, user_content
from temper.envs.base import AssistantTurn
from temper.envs.visual_grid import (
    MOVES,
    PROMPT,
    GridTasks,
    VisualGridEnv,
    make_layout,
    render_grid,
)
from temper.models.chat_template import ENDOFTEXT, IM_END, IMAGE_TOKEN, VLM_TEMPLATE
from temper.models.loader import TINY_DIR, TINY_VLM_DIR
from temper.records import Task

PATCH = 16
IMAGE_TOKENS = (SIZE // PATCH) ** 2
ASSISTANT = "<|im_start|>assistant\n"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=TINY_VLM_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="conversations per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lm-lr", type=float, default=1e-3, help="stage 2 lr of the LM and the tower")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--tower-steps", type=int, default=600, help="stage 1 steps (tower alone)")
    p.add_argument("--tower-batch", type=int, default=64)
    p.add_argument("--tower-lr", type=float, default=1e-3)
    p.add_argument(
        "--snapshots", type=Path, help="also save the model every --snapshot-every steps"
    )
    p.add_argument("--snapshot-every", type=int, default=100)
    p.add_argument("--grid-share", type=float, default=0.2, help="share of grid chats")
    p.add_argument("--vision-hidden", type=int, default=128)
    p.add_argument("--vision-layers", type=int, default=2)
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--eval-grid", type=int, default=40)
    p.add_argument("--eval-only", action="store_true", help="only measure the model at --out")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


# -- building -------------------------------------------------------------------------


def build(args: argparse.Namespace) -> tuple[LlavaForConditionalGeneration, Any, Any]:
    """(model, tokenizer, image processor): the tiny chat LM behind a fresh CLIP tower."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR)
    tokenizer.add_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    tokenizer.chat_template = VLM_TEMPLATE
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    lm = LlamaForCausalLM.from_pretrained(TINY_DIR)
    # A context of 1024 (RoPE, no learned positions): room for multi-turn grid episodes.
    text_config = lm.config.to_dict() | {
        "vocab_size": len(tokenizer), "tie_word_embeddings": False, "max_position_embeddings": 1024,
    }  # fmt: skip
    tokenizer.model_max_length = 1024
    vision = CLIPVisionConfig(
        image_size=SIZE,
        patch_size=PATCH,
        hidden_size=args.vision_hidden,
        intermediate_size=4 * args.vision_hidden,
        num_hidden_layers=args.vision_layers,
        num_attention_heads=4,
        projection_dim=args.vision_hidden,
    )
    config = LlavaConfig(
        vision_config=vision.to_dict(),
        text_config=text_config,
        image_token_index=image_id,
        image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",  # drop CLS: one token per patch
        tie_word_embeddings=False,
    )
    model = LlavaForConditionalGeneration(config)
    # The language model starts as the tiny chat model; `<image>` starts as the mean
    # embedding, and the (untied) output head as a copy of the input embeddings.
    state = {
        k.removeprefix("model."): v for k, v in lm.state_dict().items() if k != "lm_head.weight"
    }
    old = state.pop("embed_tokens.weight")
    model.model.language_model.load_state_dict(state, strict=False)
    # PyTorch's default Linear init (not transformers' std 0.02) for the projector, so
    # that image embeddings start at the scale of the token embeddings the LM knows;
    # at std 0.02 they are a third of it and the LM learns to ignore them.
    for layer in (
        model.model.multi_modal_projector.linear_1,
        model.model.multi_modal_projector.linear_2,
    ):
        layer.reset_parameters()
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[: old.shape[0]] = old
        emb[old.shape[0] :] = old.mean(0)
        model.lm_head.weight.copy_(emb)
    processor = CLIPImageProcessorPil(
        size={"height": SIZE, "width": SIZE}, crop_size={"height": SIZE, "width": SIZE},
        do_center_crop=False,
    )  # fmt: skip
    return model, tokenizer, processor


def save(model: Any, tokenizer: Any, image_processor: Any, out: Path) -> None:
    """Weights (with the checkpoint key names vLLM and transformers both load), tokenizer,
    chat template and processor config."""
    out.mkdir(parents=True, exist_ok=True)
    eos = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1])
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 writes the CLIP tower as `vision_tower.<...>`; vLLM's LLaVA wants
    # the classic `vision_tower.vision_model.<...>`, which transformers also loads.
    weights = out / "model.safetensors"
    state = {
        (f"vision_tower.vision_model.{k[len('vision_tower.'):]}" if k.startswith("vision_tower.")
         else k): v
        for k, v in load_file(weights).items()
    }  # fmt: skip
    save_file(state, weights, metadata={"format": "pt"})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=VLM_TEMPLATE,
    )
    processor.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    config["text_config"].pop("_name_or_path", None)  # a path on the machine that built it
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = VLM_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)


# -- data -----------------------------------------------------------------------------


def grid_chat(rng: random.Random, grids: GridTasks) -> tuple[list[dict[str, Any]], list[Any]]:
    """A grid chat of one or two turns, each answered with a best move."""
    task = grids.sample(rng, 1)[0]
    layout = make_layout(task.columns["key"], grids.size, grids.n_walls)
    at, messages, images, text = layout.start, [], [], PROMPT
    for turn in range(1 + (rng.random() < 0.5)):
        image = render_grid(layout, at)
        move = layout.best_move(at)
        messages += [
            {"role": "user", "content": user_content(image, text)},
            {"role": "assistant", "content": f"\\boxed{{{move}}}"},
        ]
        images.append(image)
        dx, dy = MOVES[move]
        at = (at[0] + dx, at[1] + dy)
        text = f"You moved {move}. {grids.max_moves - turn - 1} moves left."
        if at == layout.goal:
            break
    return messages, images


def task_chat(task: Task) -> tuple[list[dict[str, Any]], list[Any]]:
    messages = [*task.messages(), {"role": "assistant", "content": f"\\boxed{{{task.answer}}}"}]
    return messages, [messages[0]["content"][0]["image"]]


def encode(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(ids with each `<image>` expanded, labels: assistant replies and their `<|im_end|>`)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    ids: list[int] = []
    labels: list[int] = []
    pieces = text.split(ASSISTANT)
    for i, piece in enumerate(pieces):
        if i == 0:
            reply, rest = "", piece
        else:
            reply, _, rest = piece.partition(IM_END)
            reply += IM_END
        r_ids = tokenizer(reply, add_special_tokens=False)["input_ids"] if reply else []
        ids += r_ids
        labels += r_ids
        tail = rest + (ASSISTANT if i < len(pieces) - 1 else "")
        for t in tokenizer(tail, add_special_tokens=False)["input_ids"]:
            count = IMAGE_TOKENS if t == image_id else 1
            ids += [t] * count
            labels += [-100] * count
    return ids, labels


def batch(chats: list[tuple[list[int], list[int], list[Any]]], pad: int, processor: Any):
    """Right-padded ids, attention mask, labels and the stacked pixel values."""
    width = max(len(ids) for ids, _, _ in chats)
    ids = torch.full((len(chats), width), pad)
    labels = torch.full((len(chats), width), -100)
    mask = torch.zeros((len(chats), width), dtype=torch.long)
    images = []
    for row, (i, lab, imgs) in enumerate(chats):
        ids[row, : len(i)], labels[row, : len(lab)], mask[row, : len(i)] = (
            torch.tensor(i), torch.tensor(lab), 1,
        )  # fmt: skip
        images += imgs
    pixels = processor(images, return_tensors="pt")["pixel_values"]
    return ids, mask, labels, pixels


def lr_at(step: int, warmup: int, peak: float) -> float:
    """Linear warmup, then constant: a run of N steps is exactly the first N steps of a
    longer one, so `--snapshots` of a long run show what each shorter run would give."""
    return peak * min(1.0, (step + 1) / warmup)


def tower_example(rng: random.Random, tasks: VisualTasks, grids: GridTasks) -> tuple[Any, str]:
    """(picture, answer) for stage 1: a visual task, or a grid position and its best move."""
    if rng.random() < 0.2:
        task = grids.sample(rng, 1)[0]
        layout = make_layout(task.columns["key"], grids.size, grids.n_walls)
        at = rng.choice([c for c in layout.distances() if c != layout.goal])
        return render_grid(layout, at), f"move:{layout.best_move(at)}"
    scene = tasks.sample_scene(rng)
    return scene.image, f"{scene.kind}:{scene.answer}"


def pretrain_tower(model: Any, processor: Any, args: argparse.Namespace, rng: random.Random):
    """Stage 1: train the CLIP tower alone to classify pictures by their answers.

    LLaVA starts from a pretrained CLIP; this tiny tower has none, and trained only
    through the LM it learned nothing in 1000 steps (the LM answered from the question).
    So the tower first learns, through a throwaway linear head on its 16 patch features,
    to tell every answer apart from the picture alone; stage 2 then teaches the projector
    and the LM to read those features.
    """
    tasks, grids = VisualTasks(seed=args.seed + 1), GridTasks()
    labels = [f"count:{n}" for n in range(1, 6)] + [f"number:{n}" for n in range(10, 100)]
    labels += ["redder:left", "redder:right", "same_colour:yes", "same_colour:no"]
    labels += [f"move:{m}" for m in MOVES]
    index = {label: i for i, label in enumerate(labels)}
    tower = model.model.vision_tower
    width = IMAGE_TOKENS * tower.config.hidden_size
    head = torch.nn.Linear(width, len(labels))
    opt = torch.optim.AdamW([*tower.parameters(), *head.parameters()], lr=args.tower_lr)
    start = time.time()
    for step in range(args.tower_steps):
        examples = [tower_example(rng, tasks, grids) for _ in range(args.tower_batch)]
        pixels = processor([e[0] for e in examples], return_tensors="pt")["pixel_values"]
        target = torch.tensor([index[e[1]] for e in examples])
        features = tower(pixels).last_hidden_state[:, 1:]  # the patch features LLaVA takes
        logits = head(features.reshape(len(examples), width))
        loss = torch.nn.functional.cross_entropy(logits, target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == args.tower_steps - 1:
            acc = (logits.argmax(-1) == target).float().mean().item()
            print(
                f"tower {step:4d} loss {loss.item():.3f} acc {acc:.2f} ({time.time() - start:.0f}s)"
            )


def train(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    model, tokenizer, processor = build(args)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)
    pretrain_tower(model, processor, args, random.Random(args.seed + 1))
    tasks, grids = VisualTasks(seed=args.seed), GridTasks()
    # Stage 2: the fresh projector learns at --lr; the LM and the stage-1 tower at --lm-lr.
    projector = list(model.model.multi_modal_projector.parameters())
    ids = {id(p) for p in projector}
    rest = [p for p in model.parameters() if id(p) not in ids]
    opt = torch.optim.AdamW(
        [{"params": projector, "peak": args.lr}, {"params": rest, "peak": args.lm_lr}],
        lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0,
    )  # fmt: skip
    model.train()
    start = time.time()
    for step in range(args.steps):
        chats = []
        for _ in range(args.batch):
            if rng.random() < args.grid_share:
                messages, images = grid_chat(rng, grids)
            else:
                messages, images = task_chat(tasks.sample(rng, 1)[0])
            chats.append((*encode(tokenizer, messages), images))
        ids, mask, labels, pixels = batch(chats, tokenizer.pad_token_id, processor)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.warmup, group["peak"])
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
        if args.snapshots and (step + 1) % args.snapshot_every == 0:
            save(model, tokenizer, processor, args.snapshots / f"step_{step + 1}")
    train_s = time.time() - start
    save(model.eval(), tokenizer, processor, args.out)
    return {"params": n_params, "train_s": train_s}


# -- measuring ------------------------------------------------------------------------


@torch.no_grad()
def generate(model: Any, proc: Any, chats: list[list[dict[str, Any]]], *, sample: bool, n: int = 1):
    """For each chat, n completion texts from model.generate (left-padded batch)."""
    tok = proc.tokenizer
    tok.padding_side = "left"
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    images = [p["image"] for c in chats for m in c if not isinstance(m["content"], str)
              for p in m["content"] if p["type"] == "image"]  # fmt: skip
    enc = proc(images=images, text=texts, return_tensors="pt", padding=True)
    kwargs: dict[str, Any] = {"do_sample": False}
    if sample:
        kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    out = model.generate(**enc, max_new_tokens=12, num_return_sequences=n, **kwargs)
    gen = out[:, enc["input_ids"].shape[1] :]
    texts = tok.batch_decode(gen, skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(chats))]


def _mean(values: list[bool]) -> float:
    return round(sum(values) / max(1, len(values)), 4)


def play_grid(model: Any, proc: Any, tasks: list[Task]) -> list[bool]:
    """Greedy episodes on grid tasks (one `generate` per turn for all live episodes)."""
    envs = [VisualGridEnv() for _ in tasks]
    chats = [asyncio.run(env.reset(t)) for env, t in zip(envs, tasks, strict=True)]
    success = [False] * len(tasks)
    live = list(range(len(tasks)))
    while live:
        replies = generate(model, proc, [chats[i] for i in live], sample=False)
        still = []
        for i, (reply,) in zip(live, replies, strict=True):
            result = asyncio.run(envs[i].step(AssistantTurn(text=reply, token_ids=[])))
            chats[i] = [*chats[i], {"role": "assistant", "content": reply}, *result.observation]
            success[i] = result.info["success"]
            if not result.done and len(chats[i]) < 2 * 8 + 1:
                still.append(i)
        live = still
    return success


def evaluate(out: Path, n_tasks: int, n_grid: int, seed: int) -> dict[str, Any]:
    """Greedy and sampled accuracy on held-out visual tasks; greedy grid success."""
    from transformers import AutoProcessor

    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration.from_pretrained(out).eval()
    proc = AutoProcessor.from_pretrained(out)
    tasks = VisualTasks().heldout(n_tasks)
    greedy, sampled = [], []
    for i in range(0, len(tasks), 50):
        chunk = [t.messages() for t in tasks[i : i + 50]]
        greedy += [g[0] for g in generate(model, proc, chunk, sample=False)]
        sampled += generate(model, proc, chunk, sample=True, n=4)
    g_ok = [is_correct(t, x) for t, x in zip(tasks, greedy, strict=True)]
    s_ok = [[is_correct(t, x) for x in group] for t, group in zip(tasks, sampled, strict=True)]
    kinds: dict[str, dict[str, list[bool]]] = {}
    for t, g, s in zip(tasks, g_ok, s_ok, strict=True):
        kind = kinds.setdefault(t.category, {"greedy": [], "sampled": []})
        kind["greedy"].append(g)
        kind["sampled"] += s
    grid = play_grid(model, proc, GridTasks().heldout(n_grid)) if n_grid else []
    return {
        "n": len(tasks),
        "greedy_acc": _mean(g_ok),
        "sampled_acc": _mean([ok for group in s_ok for ok in group]),
        "pass_at_4": _mean([any(group) for group in s_ok]),
        "by_kind": {
            k: {m: _mean(v) for m, v in d.items()} | {"n": len(d["greedy"])}
            for k, d in sorted(kinds.items())
        },
        "grid_n": len(grid),
        "grid_success_greedy": _mean(grid),
        "examples": [[t.id, x] for t, x in zip(tasks[:8], greedy[:8], strict=True)],
    }


def write_model_card(out: Path, args: argparse.Namespace, stats: dict[str, Any]) -> None:
    """README.md next to the weights: what the model is, how it was made, what it scores."""
    cfg = json.loads((out / "config.json").read_text())
    vision, text = cfg["vision_config"], cfg["text_config"]
    kinds = ", ".join(
        f"{k}: greedy {v['greedy']:.0%}, sampled {v['sampled']:.0%} (n={v['n']})"
        for k, v in stats["by_kind"].items()
    )
    command = (
        f".venv/bin/python scripts/pretrain_tiny_vlm.py --seed {args.seed} --steps {args.steps} "
        f"--batch {args.batch} --lr {args.lr} --lm-lr {args.lm_lr} --warmup {args.warmup} "
        f"--tower-steps {args.tower_steps} --tower-batch {args.tower_batch} "
        f"--tower-lr {args.tower_lr} "
        f"--grid-share {args.grid_share} --vision-hidden {args.vision_hidden} "
        f"--vision-layers {args.vision_layers} --threads {args.threads}"
    )
    timing = (
        f"training took {stats['train_s']:.0f} s"
        if "train_s" in stats
        else "card written by --eval-only; see docs/vision.md for the training time"
    )
    text_md = f"""# temper built-in tiny vision-language model

A {stats.get("params", 0) / 1e6:.2f}M-parameter LLaVA (`LlavaForConditionalGeneration`) made by
`scripts/pretrain_tiny_vlm.py`: a CLIP vision tower ({vision["num_hidden_layers"]} layers,
hidden {vision["hidden_size"]}, {vision["image_size"]}x{vision["image_size"]} pictures in
{vision["patch_size"]}x{vision["patch_size"]} patches: {cfg["image_seq_length"]} image tokens),
LLaVA's two-layer projector, and the built-in tiny chat model (`temper/models/tiny`, hidden
{text["hidden_size"]}, {text["num_hidden_layers"]} layers) as the language model, with one
new token, `<image>` (id {cfg["image_token_index"]}). It exists so that Temper's vision path
(engines, rollouts, trainer) runs end to end on a laptop, and it sees *a little*: RL on
`temper.data.visual` tasks and the `visual_grid` env has room to improve it.

Load it with `temper.models.load_model("tiny_vlm")` / `load_processor("tiny_vlm")`, or
`LlavaForConditionalGeneration.from_pretrained(dir)` / `AutoProcessor.from_pretrained(dir)`;
vLLM loads the directory as it is. The chat template is the tiny model's ChatML with
OpenAI-style content parts: an image part renders as `<image>`, which the processor expands
to {cfg["image_seq_length"]} copies. The image processor is CLIP's PIL one (no torchvision):
resize to {vision["image_size"]}x{vision["image_size"]}, CLIP mean/std.

## Training

Two stages, seed {args.seed}, all on training-split tasks (the held-out split is never seen).
Stage 1 ({args.tower_steps} steps of {args.tower_batch} pictures, AdamW lr {args.tower_lr}):
the CLIP tower alone, through a throwaway linear head on its patch features, learns to
tell the answers of `temper.data.visual` pictures and the best move of `visual_grid`
positions apart. Stage 2 ({args.steps} steps of {args.batch} conversations, loss on
assistant tokens only; the projector at lr {args.lr}, the LM and the tower at
{args.lm_lr}, after {args.warmup} warmup steps, then constant): visual tasks answered
with `\\boxed{{answer}}`, and with probability {args.grid_share} a one- or two-turn
`visual_grid` chat answered with the best move. Stage 2 stops early on purpose, at a
point where the model often samples the right answer but its greedy answer is often wrong
(pass@4 well above greedy accuracy): RL has room, as in the text demo
(`configs/vision_grpo.toml`).

## Measured (held-out, n={stats["n"]}, HF generate, max 12 new tokens)

| metric | value |
|---|---|
| greedy accuracy | {stats["greedy_acc"]:.1%} |
| sampled accuracy (temperature 1.0) | {stats["sampled_acc"]:.1%} |
| pass@4 (temperature 1.0) | {stats["pass_at_4"]:.1%} |
| visual_grid greedy success (n={stats["grid_n"]}) | {stats["grid_success_greedy"]:.1%} |

By kind: {kinds}.

Rebuild ({timing}):

    {command}
"""
    (out / "README.md").write_text(text_md)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    begin = time.time()
    stats = {} if args.eval_only else train(args)
    stats |= evaluate(args.out, args.eval_n, args.eval_grid, args.seed)
    stats["total_s"] = round(time.time() - begin, 1)
    stats = {k: (round(v, 1) if isinstance(v, float) and k.endswith("_s") else v)
             for k, v in stats.items()}  # fmt: skip
    if "params" not in stats:
        model = LlavaForConditionalGeneration.from_pretrained(args.out)
        stats["params"] = sum(p.numel() for p in model.parameters())
    write_model_card(args.out, args, stats)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
