"""Tensor parallelism (``trainer.tp``) on gloo, against the one-process trainer.

One module-scoped scenario runs, beside a `PolicyTrainer`: TP2 (two ranks, one
dp_shard coordinate) and FSDP2 x TP2 with sequence parallelism and loss parallel
(four ranks) for one step each, then a DCP checkpoint written by the four ranks
resumed in two other layouts (one process, TP2) for a second step. Every update
must equal the one-process update within 1e-5 (fp32), and the metrics with it.
(FSDP2 checkpoints across world sizes: `test_distributed.py`.)
"""

import pytest
from tests.trainer.test_distributed import CFG, TOL, TOTAL_STEPS, _batch, _max_diff, _weights

from temper.config.schema import AlgoConfig, TrainerConfig
from temper.errors import ConfigError
from temper.models import load_model, load_tokenizer
from temper.trainer.checkpoint import load_checkpoint_state, save_checkpoint
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.policy_trainer import PolicyTrainer

pytestmark = pytest.mark.slow


def _dist(world_size: int, tp: int, split: bool = False) -> DistributedTrainer:
    """``split``: with sequence parallelism and loss parallel too."""
    cfg = CFG.model_copy(
        update={"world_size": world_size, "tp": tp, "sequence_parallel": split,
                "loss_parallel": split}
    )  # fmt: skip
    return DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), TOTAL_STEPS, 0)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    r: dict = {}
    plain = PolicyTrainer(load_model("tiny"), CFG, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    r["plain_stats1"] = plain.train_step(_batch(1))
    r["plain_w1"] = _weights(plain.model)
    r["plain_stats2"] = plain.train_step(_batch(2))
    r["plain_w2"] = _weights(plain.model)

    tp2 = _dist(2, 2)
    try:
        r["tp2_stats1"] = tp2.train_step(_batch(1))
        r["tp2_w1"] = _weights(tp2.model)
        dp2tp2 = _dist(4, 2, split=True)
        try:
            r["dp2tp2_stats1"] = dp2tp2.train_step(_batch(1))
            r["dp2tp2_w1"] = _weights(dp2tp2.model)
            ckpt = save_checkpoint(
                root, 1, dp2tp2.model, load_tokenizer("tiny"), dp2tp2.state_dict(),
                {"version": 1}, keep=1, write_extra=dp2tp2.write_sharded_state,
            )  # fmt: skip
        finally:
            dp2tp2.close()
        state = load_checkpoint_state(ckpt)[1]
        # FSDP2 x TP2 -> TP2 (the same two ranks as above, now resuming).
        tp2.load_checkpoint(ckpt, state)
        r["to_tp2_stats2"] = tp2.train_step(_batch(2))
        r["to_tp2_w2"] = _weights(tp2.model)
    finally:
        tp2.close()
    # FSDP2 x TP2 -> one process.
    one = PolicyTrainer(load_model(str(ckpt)), CFG, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    one.load_checkpoint(ckpt, state)
    r["to_one_w2"] = (one.train_step(_batch(2)), _weights(one.model))[1]
    return r


@pytest.mark.parametrize("layout", ["tp2", "dp2tp2"])
def test_one_step_matches_one_process(scenario, layout):
    assert _max_diff(scenario["plain_w1"], scenario[f"{layout}_w1"]) < TOL
    for key, value in scenario["plain_stats1"].items():
        got = scenario[f"{layout}_stats1"][key]
        assert got == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("layout", ["to_tp2", "to_one"])
def test_a_dp2_tp2_checkpoint_resumes_in_another_layout(scenario, layout):
    assert _max_diff(scenario["plain_w2"], scenario[f"{layout}_w2"]) < TOL


def test_the_second_step_metrics_match_after_resharding(scenario):
    for key, value in scenario["plain_stats2"].items():
        assert scenario["to_tp2_stats2"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_the_comparisons_are_not_vacuous(scenario):
    # The weights moved by more than the tolerance, and the gradient norm (which Adam's
    # update cannot show: it is invariant to the gradient's scale) was compared above.
    shipped = _weights(load_model("tiny"))
    assert _max_diff(shipped, scenario["plain_w2"]) > 1.5 * TOL
    assert scenario["plain_stats1"]["grad_norm"] > 0


def test_tp_that_does_not_divide_the_heads_is_one_config_error():
    cfg = CFG.model_copy(update={"world_size": 3, "tp": 3})
    with pytest.raises(ConfigError, match="does not divide the model's num_attention_heads = 4"):
        DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), TOTAL_STEPS, 0)


def test_world_size_must_be_a_multiple_of_tp():
    with pytest.raises(ValueError, match=r"not a multiple of trainer\.tp x trainer\.pp = 2"):
        TrainerConfig(world_size=3, tp=2)


def _model(arch: str):
    """The tiny Llama, or a random two-layer Qwen2 (q/k/v biases) or Qwen3 (q/k norms)
    with grouped KV heads, seeded alike on every rank."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    if arch == "llama":
        return load_model("tiny")
    config = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch](
        vocab_size=759, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _loss_parallel_check(mesh) -> dict:
    """The tied tiny model with its output layer and embeddings split by vocabulary:
    still tied, each rank's logits a slice of the vocabulary, and the logprobs,
    entropies and the output layer's gradient those of the unsharded model."""
    import torch

    from temper.algos import entropy_from_logits, token_logprobs
    from temper.trainer.parallel import parallelize

    torch.manual_seed(0)
    ids, targets = torch.randint(3, 700, (2, 9)), torch.randint(3, 759, (2, 9))
    plain, model = load_model("tiny"), load_model("tiny")
    vocab = parallelize(model, mesh, sequence_parallel=True, loss_parallel=True)
    results = {}
    for name, net in (("plain", plain), ("sharded", model)):
        logits = net(input_ids=ids).logits
        if net is model:
            lp, ent = vocab.logprobs(logits, targets), vocab.entropy(logits)
        else:
            lp, ent = token_logprobs(logits, targets), entropy_from_logits(logits)
        (lp.sum() + ent.sum()).backward()
        grad = net.lm_head.weight.grad
        results[name] = (logits.shape[-1], lp.detach(), ent.detach(), grad.full_tensor()
                         if hasattr(grad, "full_tensor") else grad)  # fmt: skip
    (width, lp, ent, grad), (full, lp0, ent0, grad0) = results["sharded"], results["plain"]
    return {
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "width": (width, vocab.start, vocab.size, full),
        # Relative to each reference's largest magnitude (fp32 sums in another order).
        "diff": max(
            float((a - b).abs().max() / b.abs().max())
            for a, b in ((lp, lp0), (ent, ent0), (grad, grad0))
        ),
    }


def _sequence_parallel_rank(rank: int, port: int, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    from temper.trainer.parallel import build_mesh, parallelize

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mesh = build_mesh(2, 2, "cpu")
        for arch in ("llama", "qwen2", "qwen3"):
            torch.manual_seed(0)
            ids = torch.randint(3, 700, (2, 9))
            plain = _model(arch).eval()
            model = _model(arch).eval()
            parallelize(model, mesh, sequence_parallel=True)
            seen = []
            norm = model.model.layers[1].input_layernorm
            norm.register_forward_hook(lambda _m, args, _o, seen=seen: seen.append(args[0]))
            with torch.no_grad():
                got, want = model(input_ids=ids).logits, plain(input_ids=ids).logits
            x = seen[0]
            out[(rank, arch)] = {
                "dtensor": isinstance(x, DTensor) and x.placements == (Shard(1),),
                "local_len": x.to_local().shape[1] if isinstance(x, DTensor) else -1,
                "plain_output": not isinstance(got, DTensor),
                "max_diff": float((got - want).abs().max()),
            }
        out[(rank, "loss_parallel")] = _loss_parallel_check(mesh)
    finally:
        dist.destroy_process_group()


def test_sequence_parallel_splits_the_norms_by_sequence_and_keeps_the_logits():
    # Llama, Qwen2 and Qwen3 layers under TP2 with sequence parallelism, forward only.
    import multiprocessing as mp

    from ports import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        procs = [ctx.Process(target=_sequence_parallel_rank, args=(r, port, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        results = dict(out)
    assert len(results) == 8
    for rank in (0, 1):  # loss parallel: 380 + 379 columns of the 759-token vocabulary
        r = results.pop((rank, "loss_parallel"))
        assert r["tied"] and r["width"] == ((380, 0, 380, 759), (379, 380, 379, 759))[rank], r
        assert r["diff"] < 1e-5, r
    for (rank, _arch), r in results.items():
        # A layer's norm sees its rank's half of the 9 positions (5 and 4), as a DTensor.
        assert r["dtensor"] and r["local_len"] == (5 if rank == 0 else 4), r
        assert r["plain_output"] and r["max_diff"] < 1e-5, r


def test_sequence_and_loss_parallel_need_tp():
    for flag in ("sequence_parallel", "loss_parallel"):
        with pytest.raises(ValueError, match=rf"{flag} = true needs trainer\.tp > 1"):
            TrainerConfig(world_size=2, **{flag: True})
