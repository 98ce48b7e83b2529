"""LoRA RL ([lora]): only the adapters train; engines serve exactly what the trainer
computes after every adapter update; checkpoints hold the adapter and resume exactly;
`temper export` merges it; bad input gets one line, exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file

from fp32 import ENGINE_PARITY, SAME_MATH
from quick_run import LORA_RUN, exit_code, metrics, train
from temper.builder.trainer import build_lora
from temper.cli.main import main
from temper.config.lora import LINEAR_LAYERS, LoraConfig
from temper.config.schema import AlgoConfig, CriticConfig, TrainerConfig
from temper.engine.base import SamplingParams
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer
from temper.records import Trajectory
from temper.trainer.checkpoint import load_checkpoint_state, save_checkpoint
from temper.trainer.critic import Critic
from temper.trainer.policy_trainer import PolicyTrainer
from temper.weights import push_weights
from temper.weights.adapter import LORA_A, LORA_B, merge, merge_into

PROMPTS = [[1, 87, 85, 20], [1, 87, 85, 21, 22, 23]]


def _trajs(n: int = 8, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        resp = torch.randint(3, 600, (6 + i % 3,), generator=g).tolist()
        out.append(
            Trajectory(
                task_id=f"t{i // 4}",
                group_id=i // 4,
                prompt_ids=[1, 87, 85, 20 + i % 4],
                response_ids=resp,
                loss_mask=[1] * len(resp),
                behaviour_logprobs=[-1.0] * len(resp),
                versions=[0] * len(resp),
                finish_reason="stop",
                advantage=1.0 if i % 2 else -1.0,
                reward=float(i % 2),  # PPO with a critic learns from the rewards
            )
        )
    return out


def _trainer(rank: int = 4, lr: float = 1e-3, critic: str | None = None, **kw) -> PolicyTrainer:
    model = load_model("tiny")
    torch.manual_seed(0)  # peft draws A at random (B starts at 0)
    adapter = build_lora(LoraConfig(rank=rank), model)
    cfg = TrainerConfig(lr=lr, warmup_steps=0, **kw)
    value = None
    if critic is not None:
        value = Critic(CriticConfig(kind=critic), cfg, model, None, 10)
    algo = AlgoConfig(advantage="gae") if critic else AlgoConfig()
    return PolicyTrainer(model, cfg, algo, 10, 0, adapter=adapter, critic=value)


def _logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)


def test_only_the_adapters_train_and_hold_optimizer_state():
    trainer = _trainer(critic="head")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step(_trajs())
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    # Every linear layer of attention and MLP of each of the 4 blocks: A and B.
    assert len(trainable) == 4 * len(LINEAR_LAYERS) * 2
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
    for name, p in trainer.model.named_parameters():
        if name in trainable:
            continue
        assert torch.equal(p, before[name]), f"{name} is frozen but changed"
    changed = [n for n in trainable if not torch.equal(trainer.model.get_parameter(n), before[n])]
    assert any(".lora_B." in n for n in changed)  # B starts at 0: the first step moves it
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert held == {id(trainer.model.get_parameter(n)) for n in trainable}
    assert len(trainer.optimizer.state) == len(trainable)
    # The update the engines get is the adapter: A and scale * B per layer.
    update = trainer.engine_state_dict()
    assert len(update) == len(trainable) and all(k.endswith((LORA_A, LORA_B)) for k in update)


def test_micro_batches_and_packing_give_the_same_adapter_gradients():
    """One sequence per micro-batch, or packed rows, accumulate the gradient of the whole
    batch (compared as gradients: Adam's first step is about sign(g), which turns float
    noise in a gradient near 0 into a whole step)."""
    grads, stats = [], []
    for kw in ({"micro_batch_tokens": 1 << 16}, {"micro_batch_tokens": 40}, {"packing": True}):
        trainer = _trainer(lr=1e-2, **kw)
        if kw.get("micro_batch_tokens") == 40:
            assert len(trainer._plan(_trajs())) > 2  # several micro-batches
        stats.append(trainer.train_step(_trajs()))
        grads.append({n: p.grad for n, p in trainer.model.named_parameters() if p.requires_grad})
    for other, other_stats in zip(grads[1:], stats[1:], strict=True):
        assert other_stats["loss"] == pytest.approx(stats[0]["loss"], rel=1e-5, abs=1e-7)
        assert other_stats["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-4)
        for name, grad in grads[0].items():
            torch.testing.assert_close(other[name], grad, rtol=1e-4, atol=1e-7)


def test_engines_serve_the_trainers_forward_after_each_adapter_update():
    trainer = _trainer(lr=2e-2)
    engines = {
        "native": NativeEngine(load_model("tiny"), max_slots=8),
        "hf": HFEngine(load_model("tiny")),
    }
    base = {n: p.detach().clone() for n, p in load_model("tiny").named_parameters()}
    params = SamplingParams(n=2, max_new_tokens=10, seed=3, ignore_eos=True)
    start = {}
    for version in (1, 2, 3):
        trainer.train_step(_trajs(seed=version))
        update = trainer.engine_state_dict()
        trainer.model.eval()
        for kind, engine in engines.items():
            push_weights(engine, update, version)
            for prompt in PROMPTS:
                result = asyncio.run(engine.generate(prompt, params))
                for s in result.samples:
                    assert s.policy_versions == [version] * len(s.token_ids)
                    want = _logprobs(trainer.model, prompt, s.token_ids)
                    torch.testing.assert_close(torch.tensor(s.logprobs), want, **ENGINE_PARITY)
                    start.setdefault((kind, len(prompt)), (s.token_ids, want))
    # The adapters moved the policy: the first update's tokens are scored differently now.
    tokens, first = start[("native", len(PROMPTS[0]))]
    assert (first - _logprobs(trainer.model, PROMPTS[0], tokens)).abs().max() > 1e-3
    # Each merge starts again from the kept base W0: the engine's weight is W0 + B A
    # computed once, whatever came before (no error accumulates over updates).
    native = engines["native"]
    merged = dict(merge_into(load_model("tiny"), update).named_parameters())
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj"):
        want = merge(base[name + ".weight"], update[name + LORA_A], update[name + LORA_B])
        assert torch.equal(native._model.read(name + ".weight"), want)
        assert torch.equal(merged[name + ".weight"], want)  # the benchmarks' merged model
    with pytest.raises(ValueError, match="do not fit its weight"):
        merge_into(load_model("tiny"), {k: v.T for k, v in update.items()})
    for engine in engines.values():
        asyncio.run(engine.close())


def test_an_adapter_update_is_a_small_fraction_of_a_full_one():
    full = load_model("tiny")
    full_bytes = sum(t.numel() * t.element_size() for t in full.state_dict().values())
    for rank in (1, 8):
        update = _trainer(rank=rank).engine_state_dict()
        got = sum(t.numel() * t.element_size() for t in update.values())
        # rank x (in + out) values per layer: hidden 128, intermediate 512, 4 layers.
        per_layer = rank * (4 * (128 + 128) + 2 * (128 + 512) + (512 + 128))
        assert got == 4 * per_layer * 4
        assert got / full_bytes < 0.01 * rank + 0.001


def test_a_checkpoint_holds_the_adapter_and_resumes_exactly(tmp_path):
    steps = [_trajs(seed=s) for s in range(3)]
    a = _trainer(lr=1e-2)
    for trajs in steps[:2]:
        a.train_step(trajs)
    tokenizer = load_tokenizer("tiny")
    ckpt = save_checkpoint(
        tmp_path, 2, a.saved_model(), tokenizer, a.state_dict(), {"version": 2}, keep=2
    )
    assert (ckpt / "adapter_model.safetensors").is_file() and (
        ckpt / "adapter_config.json"
    ).is_file()
    assert not (ckpt / "model.safetensors").exists()
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    assert len(saved) == 4 * len(LINEAR_LAYERS) * 2
    a.train_step(steps[2])

    b = _trainer(lr=1e-2)  # a fresh base, as a resumed run loads it
    _state, trainer_state, _rng = load_checkpoint_state(ckpt)
    b.load_checkpoint(ckpt, trainer_state)
    b.train_step(steps[2])
    ua, ub = a.engine_state_dict(), b.engine_state_dict()
    assert ua.keys() == ub.keys()
    for name in ua:
        assert torch.equal(ua[name], ub[name]), name
    # An adapter of another rank is refused in one line.
    with pytest.raises(Exception, match="holds a LoRA adapter of rank 4"):
        _trainer(rank=2).load_checkpoint(ckpt, trainer_state)


def test_undo_restores_the_adapter():
    trainer = _trainer(lr=1e-2)
    trainer.train_step(_trajs())
    snap = trainer.snapshot()
    assert all(".lora_" in name for name in snap["model"])  # the adapters only
    before = trainer.engine_state_dict()
    trainer.train_step(_trajs(seed=1))
    trainer.restore(snap)
    after = trainer.engine_state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)


RUN = LORA_RUN
VOLATILE = ("time_", "gen_tokens_per_s", "peak_rss", "placement/")


def _steps(run) -> dict[int, dict]:
    return {
        m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in metrics(run)
    }


def test_a_lora_run_resumes_exactly_and_exports(tmp_path, capsys):
    full = _steps(train(tmp_path, "full", *RUN, "--orchestrator.steps=3", "--log.progress=true"))
    said = capsys.readouterr()
    train(tmp_path, "cut", *RUN, "--orchestrator.steps=2", "--checkpoint.at_end=true")
    saved = load_file(
        str(tmp_path / "cut" / "checkpoints" / "step_2" / "adapter_model.safetensors")
    )
    n = sum(t.numel() for t in saved.values())
    # The console says the run trains adapters: how many weights, and at which rate.
    assert f"lora: rank 2, {n:,} adapter weights train (" in said.out + said.err
    assert "lr 0.005 (trainer.lr x lora.lr_multiplier 10)" in said.out + said.err
    again = _steps(train(tmp_path, "cut", *RUN, "--orchestrator.steps=3", "--run.resume=true"))
    assert sorted(again) == [1, 2, 3]
    assert again[3].keys() == full[3].keys()
    for key, value in full[3].items():
        tolerance = {"abs": 1e-4} if key.startswith(("is_", "train_infer")) else {"rel": 1e-5}
        assert again[3][key] == pytest.approx(value, **tolerance), key
    # The engines after the resume serve the checkpoint's adapter, not the base: the
    # trainer's logprobs of their samples match them.
    assert again[3]["train_infer_logprob_diff"] < 1e-3

    ckpt, out = tmp_path / "cut" / "checkpoints" / "step_2", tmp_path / "merged"
    assert main(["export", str(ckpt), str(out)]) == 0
    merged = load_model(str(out))
    peft = pytest.importorskip("peft")
    with warnings.catch_warnings():  # transformers' deprecation note, through peft
        warnings.simplefilter("ignore", FutureWarning)
        adapted = peft.PeftModel.from_pretrained(load_model("tiny"), str(out / "adapter"))
    tokens = [40, 41, 42, 43, 44]
    torch.testing.assert_close(
        _logprobs(merged, PROMPTS[0], tokens), _logprobs(adapted, PROMPTS[0], tokens), **SAME_MATH
    )
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 2


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["--lora.rank=0"], "lora.rank"),
        (["--lora.alpha=16"], "lora.rank"),
        (["--lora.rank=4", '--lora.target_modules=["q_proj", "qkv_proj"]'], "lora.target_modules"),
        (["--lora.rank=4", "--trainer.world_size=2", "--trainer.tp=2"], "trainer.tp = 2"),
        (["--lora.rank=600", "--engine.type=vllm"], "vLLM takes ranks up to 512"),
    ],
    ids=["rank_0", "no_rank", "unknown_module", "tp", "vllm"],
)
def test_bad_input_gets_one_line_and_exit_2(tmp_path, capsys, overrides, names):
    assert exit_code(tmp_path, "bad", *overrides) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("temper: error: ") and names in line, line
    assert not (tmp_path / "bad").exists()


def test_export_refuses_what_is_not_a_lora_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert main(["export", str(load_model("tiny").name_or_path), str(tmp_path / "out")]) == 2
    first, second = capsys.readouterr().err.strip().splitlines()
    assert "is not a directory" in first and "holds a whole model" in second


def test_peft_is_imported_only_with_lora():
    code = (
        "import sys, temper.orchestrator.loop, temper.cli.main, temper.engine.native;"
        "from temper.models import load_model; load_model('tiny');"
        "print('peft' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
