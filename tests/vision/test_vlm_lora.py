"""LoRA on a vision-language model: adapters in the language model only (the vision
tower and projector stay as loaded); after each adapter update the native and HF
engines serve, over images, exactly the trainer's forward; the native engine keeps
the features it encoded (an adapter update cannot change them); a `temper train`
run checkpoints the adapter and `temper export` writes a merged VLM that loads with
its processor."""

from __future__ import annotations

import asyncio
import json
import warnings

import pytest
import torch

from temper.builder.trainer import build_lora
from temper.cli.main import main
from temper.config.lora import LINEAR_LAYERS, LoraConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.engine.base import SamplingParams
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.models import load_model
from temper.rollout.single_turn import PromptRenderer, rollout_groups
from temper.trainer.policy_trainer import PolicyTrainer
from temper.vision import ImageStore, load_image
from temper.vision.processor import VisionProcessor, pixel_source
from temper.weights import push_weights
from temper.weights.adapter import LORA_A, LORA_B
from tiny_llava import assert_trainer_matches_engine, picture, picture_task
from tiny_llava import picture_dataset as _dataset

SEEDS = (1, 2)
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)


def _rollouts(engine, vlm, seed: int):
    _, tokenizer, vision = vlm
    renderer = PromptRenderer(tokenizer, vision=vision)
    tasks = [picture_task(i, s) for i, s in enumerate(SEEDS)]
    groups = asyncio.run(rollout_groups(engine, renderer, tasks, PARAMS, seed=seed))
    trajs = [t for g in groups for t in g]
    for i, t in enumerate(trajs):
        t.advantage = 1.0 if i % 2 else -1.0
    return trajs


@pytest.fixture
def lora_vlm(llava_path, vlm, tmp_path):
    """A LoRA trainer of the tiny LLaVA, its image store, and both engines on the base."""
    _, tokenizer, vision = vlm
    store = ImageStore(tmp_path / "images")
    for seed in SEEDS:
        store.put(load_image(picture(seed)))
    model = load_model(llava_path)
    torch.manual_seed(0)  # peft draws A at random
    adapter = build_lora(LoraConfig(rank=4), model)
    cfg = TrainerConfig(lr=2e-2, warmup_steps=0)
    pixels = pixel_source(vision, store)
    trainer = PolicyTrainer(model, cfg, AlgoConfig(), 10, 0, pixels=pixels, adapter=adapter)
    engines = {
        "native": NativeEngine(load_model(llava_path), tokenizer, vision=vision),
        "hf": HFEngine(load_model(llava_path), tokenizer, vision=vision),
    }
    yield trainer, store, engines
    for engine in engines.values():
        asyncio.run(engine.close())


def test_only_the_language_models_adapters_train(lora_vlm, vlm):
    trainer, _, engines = lora_vlm
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step(_rollouts(engines["native"], vlm, seed=0))
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    # Every linear layer of attention and MLP in the 4 decoder blocks, A and B; none
    # in the CLIP tower (whose q_proj/k_proj/v_proj share the names) or the projector.
    assert len(trainable) == 4 * len(LINEAR_LAYERS) * 2
    assert all(n.startswith("model.language_model.") for n in trainable)
    for name, p in trainer.model.named_parameters():
        if name not in trainable:
            assert torch.equal(p, before[name]), f"{name} is frozen but changed"
    assert any(not torch.equal(trainer.model.get_parameter(n), before[n]) for n in trainable)
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert held == {id(trainer.model.get_parameter(n)) for n in trainable}
    update = trainer.engine_state_dict()
    assert len(update) == len(trainable)
    assert all(k.startswith("model.language_model.") for k in update)
    assert all(k.endswith((LORA_A, LORA_B)) for k in update)


def test_engines_serve_the_trainers_forward_over_images_after_each_adapter_update(lora_vlm, vlm):
    trainer, store, engines = lora_vlm
    _, _, vision = vlm
    encoder = engines["native"]._encoder
    assert encoder is not None
    first = _rollouts(engines["native"], vlm, seed=1)
    assert encoder.encoded == len(SEEDS)
    for version in (1, 2):
        trainer.train_step(_rollouts(engines["native"], vlm, seed=10 + version))
        update = trainer.engine_state_dict()
        trainer.model.eval()
        for kind, engine in engines.items():
            push_weights(engine, update, version)
            trajs = _rollouts(engine, vlm, seed=20 + version)
            assert all(v == version for t in trajs for v in t.versions), kind
            assert_trainer_matches_engine(trainer.model, trajs, vision, store)
        trainer.model.train()
    # The tower and projector never changed: the native engine encoded each picture
    # once, before the first update, and served every later request from that cache.
    assert encoder.encoded == len(SEEDS)
    # The adapters moved the policy: the first rollouts' tokens now score otherwise.
    trainer.model.eval()
    with pytest.raises(AssertionError):
        assert_trainer_matches_engine(trainer.model, first, vision, store)


def _run_args(llava_path, tmp_path, name: str, *extra: str) -> list[str]:
    return [
        "train",
        f"--model.path={llava_path}",
        "--data.type=file",
        f"--data.path={tmp_path / 'train.parquet'}",
        f"--data.eval_path={tmp_path / 'eval.parquet'}",
        f"--run.output_dir={tmp_path / 'runs'}",
        f"--run.name={name}",
        "--orchestrator.steps=2",
        "--orchestrator.prompts_per_step=2",
        "--orchestrator.group_size=3",
        "--orchestrator.drop_zero_variance_groups=false",
        "--orchestrator.max_response_tokens=6",
        "--eval.at_start=false",
        "--eval.every=0",
        "--log.progress=false",
        *extra,
    ]


@pytest.mark.slow
def test_a_lora_vlm_run_checkpoints_the_adapter_and_exports_a_vlm(llava_path, tmp_path):
    _dataset(tmp_path / "train.parquet", range(4))
    _dataset(tmp_path / "eval.parquet", range(100, 102))
    # The random tiny LLaVA never answers "3": a reward that varies with what it
    # writes gives the groups advantages, so the adapter moves.
    spread = tmp_path / "spread.py"
    spread.write_text(
        "def reward(completions, **kw):\n    return [len(str(c)) % 3 / 2 for c in completions]\n"
    )
    args = _run_args(
        llava_path, tmp_path, "lora", "--lora.rank=2", "--checkpoint.every=2",
        '--reward.components=[{type="python",function="' + f"{spread}:reward" + '"}]',
        "--reward.filters=[]",
    )  # fmt: skip
    assert main(args) == 0
    run = tmp_path / "runs" / "lora"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # Step 2 sampled on the native engine after step 1's adapter update: the trainer's
    # forward over the images gives the engine's logprobs back.
    assert all(m["train_infer_logprob_diff"] < 1e-4 for m in metrics)
    ckpt = run / "checkpoints" / "step_2"
    assert (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists()  # the adapter, not the model

    out = tmp_path / "merged"
    assert main(["export", str(ckpt), str(out)]) == 0
    merged = load_model(out)
    assert type(merged).__name__ == "LlavaForConditionalGeneration"
    vision = VisionProcessor.from_pretrained(out)
    assert vision is not None  # the processor came along: it runs as a VLM
    peft = pytest.importorskip("peft")
    with warnings.catch_warnings():  # transformers' deprecation note, through peft
        warnings.simplefilter("ignore", FutureWarning)
        adapted = peft.PeftModel.from_pretrained(load_model(llava_path), str(out / "adapter"))
    image = load_image(picture(3))
    ids = torch.tensor([[1, 5, 6, *vision.image_run(image), 7, 8]])
    pixels = vision.pixel_inputs([image])
    with torch.no_grad():
        want = adapted(input_ids=ids, **pixels).logits
        got = merged(input_ids=ids, **pixels).logits
        base = load_model(llava_path)(input_ids=ids, **pixels).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (got - base).abs().max() > 1e-4  # the merged model is not the base


def test_a_vision_tower_layer_as_a_lora_target_is_refused(llava_path, tmp_path, capsys):
    """`fc1` is a linear layer of the CLIP tower only: naming it is one line, exit 2."""
    _dataset(tmp_path / "train.parquet", range(2))
    _dataset(tmp_path / "eval.parquet", range(100, 102))
    args = _run_args(llava_path, tmp_path, "bad", "--lora.rank=2", '--lora.target_modules=["fc1"]')
    assert main(args) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "'fc1' names no linear layer" in line and "vision tower and projector" in line, line
