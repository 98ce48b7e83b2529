"""The FSDP2 trainer (world_size 2, gloo on CPU) against the one-process trainer.

One module-scoped scenario spawns the two ranks once (process start-up is most
of the cost) and runs, side by side with a `PolicyTrainer`: step 1, a
checkpoint each, step 2; then step 2 again after resuming each checkpoint on
the other world size (and the DCP one on the same). The tests check pieces of
it. Steps use two mini-batches and a small micro-batch budget, so the ranks
run different numbers of micro-batches (padded with empty ones) and the
warmup schedule makes the scheduler state matter.
"""

import os
import signal
import time

import pytest
import torch

from fp32 import SAME_MATH
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.errors import ConfigError
from temper.models import load_model, load_tokenizer
from temper.records import Trajectory
from temper.trainer.checkpoint import (
    DCP_DIR,
    load_checkpoint_state,
    save_checkpoint,
)
from temper.trainer.distributed import DistributedTrainer, TrainerWorkerError, resolve_backend
from temper.trainer.policy_trainer import PolicyTrainer

# Adam turns float-rounding differences in near-zero gradients into weight differences
# proportional to lr: at lr 1e-4 even two micro-batch budgets in ONE process differ by
# ~1e-5 after a step. At 2e-5 the tolerance below tests the gradient path, not Adam's eps.
CFG = TrainerConfig(lr=2e-5, warmup_steps=3, micro_batch_tokens=48, mini_batches=2)
TOTAL_STEPS = 4
TOL = 1e-5


def _batch(seed: int, n: int = 7) -> list[Trajectory]:
    """``n`` scored trajectories in groups of 3 (the last one shorter), lengths 1 to 9."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        resp = torch.randint(3, 600, (1 + (i * 5 + seed) % 9,), generator=g).tolist()
        out.append(
            Trajectory(
                task_id=f"t{i // 3}",
                group_id=i // 3,
                prompt_ids=[1, 87, 85, 20 + i // 3, 30 + seed],
                response_ids=resp,
                loss_mask=[1] * len(resp),
                behaviour_logprobs=[-1.0] * len(resp),
                versions=[0] * len(resp),
                finish_reason="stop",
                advantage=float(torch.randn((), generator=g)),
            )
        )
    return out


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _save(root, trainer, tokenizer, **kw):
    return save_checkpoint(
        root, 1, trainer.model, tokenizer, trainer.state_dict(), {"version": 1}, keep=1, **kw
    )


def _plain(path="tiny") -> PolicyTrainer:
    return PolicyTrainer(load_model(path), CFG, AlgoConfig(), TOTAL_STEPS, pad_id=0)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    tokenizer = load_tokenizer("tiny")
    r: dict = {"shipped": _weights(load_model("tiny"))}

    plain = _plain()
    r["plain_batch1"] = _batch(1)
    r["plain_stats1"] = plain.train_step(r["plain_batch1"])
    r["plain_w1"] = _weights(plain.model)
    r["plain_ckpt"] = _save(root / "plain", plain, tokenizer)
    r["plain_stats2"] = plain.train_step(_batch(2))
    r["plain_w2"] = _weights(plain.model)

    cfg2 = CFG.model_copy(update={"world_size": 2})
    dist = DistributedTrainer(load_model("tiny"), "tiny", cfg2, AlgoConfig(), TOTAL_STEPS, 0)
    try:
        r["dist_batch1"] = _batch(1)
        r["dist_stats1"] = dist.train_step(r["dist_batch1"])
        r["dist_w1"] = _weights(dist.model)
        r["dist_ckpt"] = _save(root / "dist", dist, tokenizer, write_extra=dist.write_sharded_state)
        r["dist_stats2"] = dist.train_step(_batch(2))
        r["dist_w2"] = _weights(dist.model)

        # 2 -> 1: the DCP checkpoint in one process.
        resumed = _plain(str(r["dist_ckpt"]))
        resumed.load_checkpoint(r["dist_ckpt"], load_checkpoint_state(r["dist_ckpt"])[1])
        r["2to1_stats2"] = resumed.train_step(_batch(2))
        r["2to1_w2"] = _weights(resumed.model)

        # 1 -> 2: the one-process checkpoint on the two ranks (weights included).
        dist.load_checkpoint(r["plain_ckpt"], load_checkpoint_state(r["plain_ckpt"])[1])
        r["1to2_w1"] = _weights(dist.model)
        r["1to2_stats2"] = dist.train_step(_batch(2))
        r["1to2_w2"] = _weights(dist.model)

        # 2 -> 2: the DCP checkpoint back on the ranks.
        dist.load_checkpoint(r["dist_ckpt"], load_checkpoint_state(r["dist_ckpt"])[1])
        dist.train_step(_batch(2))
        r["2to2_w2"] = _weights(dist.model)

        # One sequence on two ranks (rank 0 gets none), from the same state as `resumed`.
        r["single"] = _batch(4, n=1)
        r["single_dist_stats"] = dist.train_step(r["single"])
        r["single_dist_w"] = _weights(dist.model)
        r["single_plain_stats"] = resumed.train_step(_batch(4, n=1))
        r["single_plain_w"] = _weights(resumed.model)

        # A rank killed mid-run: the next call fails fast with the rank named.
        os.kill(dist._procs[1].pid, signal.SIGKILL)
        started = time.monotonic()
        try:
            dist.train_step(_batch(3))
        except TrainerWorkerError as exc:
            r["death_error"] = exc
        r["death_seconds"] = time.monotonic() - started
    finally:
        dist.close()
    r["procs_alive"] = [p.is_alive() for p in dist._procs]
    return r


@pytest.mark.slow
def test_one_step_on_two_ranks_matches_one_process(scenario):
    diff = _max_diff(scenario["plain_w1"], scenario["dist_w1"])
    print(f"world_size 2 vs 1, step 1: max |dw| = {diff:.3g}")
    assert diff < TOL
    assert _max_diff(scenario["shipped"], scenario["dist_w1"]) > 1e-5  # it did train
    # Each rank reports the trainer logprobs of its rows; together, every row's.
    for a, b in zip(scenario["plain_batch1"], scenario["dist_batch1"], strict=True):
        assert b.trainer_logprobs is not None and len(b.trainer_logprobs) == len(b.response_ids)
        torch.testing.assert_close(
            torch.tensor(b.trainer_logprobs), torch.tensor(a.trainer_logprobs), **SAME_MATH
        )


@pytest.mark.slow
def test_metrics_on_two_ranks_match_one_process(scenario):
    for step in (1, 2):
        plain, dist = scenario[f"plain_stats{step}"], scenario[f"dist_stats{step}"]
        assert plain.keys() == dist.keys()
        for key, value in plain.items():
            assert dist[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
    # train_tokens is per optimizer step: the batch's tokens over its two mini-batches.
    tokens = sum(len(t.response_ids) for t in scenario["dist_batch1"])
    assert scenario["dist_stats1"]["train_tokens"] == pytest.approx(tokens / 2)


@pytest.mark.slow
def test_second_step_still_matches(scenario):
    diff = _max_diff(scenario["plain_w2"], scenario["dist_w2"])
    print(f"world_size 2 vs 1, step 2: max |dw| = {diff:.3g}")
    assert diff < TOL


@pytest.mark.slow
def test_dcp_checkpoint_from_two_ranks_resumes_in_one_process(scenario):
    ckpt = scenario["dist_ckpt"]
    shards = sorted(p.name for p in (ckpt / DCP_DIR).glob("*.distcp"))
    assert len(shards) == 2, shards  # one file per rank
    state = load_checkpoint_state(ckpt)[1]
    assert state["format"] == "dcp" and state["world_size"] == 2
    diff = _max_diff(scenario["dist_w2"], scenario["2to1_w2"])
    print(f"resume 2 -> 1, step 2: max |dw| vs uninterrupted = {diff:.3g}")
    assert diff < TOL
    assert scenario["2to1_stats2"]["lr"] == pytest.approx(scenario["dist_stats2"]["lr"])


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_ranks(scenario):
    assert _max_diff(scenario["plain_w1"], scenario["1to2_w1"]) == 0.0
    diff = _max_diff(scenario["plain_w2"], scenario["1to2_w2"])
    print(f"resume 1 -> 2, step 2: max |dw| vs uninterrupted = {diff:.3g}")
    assert diff < TOL
    assert scenario["1to2_stats2"]["lr"] == pytest.approx(scenario["plain_stats2"]["lr"])


@pytest.mark.slow
def test_dcp_checkpoint_resumes_on_the_same_ranks(scenario):
    assert _max_diff(scenario["dist_w2"], scenario["2to2_w2"]) < TOL


@pytest.mark.slow
def test_more_ranks_than_sequences(scenario):
    assert scenario["single"][0].trainer_logprobs is not None
    assert _max_diff(scenario["single_plain_w"], scenario["single_dist_w"]) < TOL
    plain, dist = scenario["single_plain_stats"], scenario["single_dist_stats"]
    assert dist["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-6)
    assert dist["train_tokens"] == plain["train_tokens"] == len(scenario["single"][0].response_ids)


@pytest.mark.slow
def test_a_dead_rank_is_an_error_not_a_hang(scenario):
    error = scenario.get("death_error")
    assert isinstance(error, TrainerWorkerError)
    assert "trainer rank 1" in str(error).splitlines()[0]
    assert scenario["death_seconds"] < 30
    assert scenario["procs_alive"] == [False, False]


def test_nccl_without_cuda_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend(None, 2) == "gloo"
    with pytest.raises(ConfigError, match=r"trainer\.backend = 'nccl' needs CUDA"):
        resolve_backend("nccl", 2)


def test_world_size_is_validated():
    assert TrainerConfig().world_size == 1
    with pytest.raises(ValueError, match="world_size"):
        TrainerConfig(world_size=0)


def test_sharded_state_is_written_inside_the_atomic_checkpoint(tmp_path):
    trainer = _plain()
    tokenizer = load_tokenizer("tiny")
    seen = []

    def write(directory):
        seen.append(directory)
        (directory / DCP_DIR).mkdir()
        (directory / DCP_DIR / ".metadata").write_text("x")

    final = _save(tmp_path, trainer, tokenizer, write_extra=write)
    assert seen[0] != final and seen[0].parent == final.parent  # the temporary sibling
    assert (final / DCP_DIR / ".metadata").read_text() == "x"

    def boom(directory):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, trainer.model, tokenizer, {}, {}, keep=3, write_extra=boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


@pytest.mark.slow
def test_packed_step_on_two_ranks_matches_one_process():
    """``trainer.packing`` on two ranks: groups split by tokens, the lighter rank padded
    with empty packed rows; the update, metrics and logprobs equal one process's."""
    # 16 tokens a row: rank 0 runs two rows per mini-batch, rank 1 one and an empty one.
    cfg = CFG.model_copy(update={"packing": True, "micro_batch_tokens": 16})
    plain = PolicyTrainer(load_model("tiny"), cfg, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    plain_batch = _batch(5, n=10)
    plain_stats = plain.train_step(plain_batch)
    dist = DistributedTrainer(
        load_model("tiny"), "tiny", cfg.model_copy(update={"world_size": 2}), AlgoConfig(),
        TOTAL_STEPS, 0,
    )  # fmt: skip
    try:
        dist_batch = _batch(5, n=10)
        dist_stats = dist.train_step(dist_batch)
    finally:
        dist.close()
    assert _max_diff(_weights(plain.model), _weights(dist.model)) < TOL
    for key, value in plain_stats.items():
        assert dist_stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for a, b in zip(plain_batch, dist_batch, strict=True):
        torch.testing.assert_close(
            torch.tensor(b.trainer_logprobs), torch.tensor(a.trainer_logprobs), **SAME_MATH
        )


@pytest.mark.slow
def test_per_token_advantages_on_two_ranks_match_one_process():
    """Turn-level credit's `token_advantages` travel with the trajectories to the ranks:
    the two-rank update and metrics equal one process's, and the loss is not the one
    of broadcasting `advantage`."""

    def batch(per_token: bool) -> list[Trajectory]:
        out = _batch(6, n=8)
        for i, t in enumerate(out):
            if per_token:
                t.token_advantages = [((i + k) % 3 - 1) * 0.7 for k in range(len(t.response_ids))]
        return out

    plain = _plain()
    plain_stats = plain.train_step(batch(True))
    broadcast_stats = _plain().train_step(batch(False))
    dist = DistributedTrainer(
        load_model("tiny"), "tiny", CFG.model_copy(update={"world_size": 2}), AlgoConfig(),
        TOTAL_STEPS, 0,
    )  # fmt: skip
    try:
        dist_stats = dist.train_step(batch(True))
    finally:
        dist.close()
    assert _max_diff(_weights(plain.model), _weights(dist.model)) < TOL
    for key, value in plain_stats.items():
        assert dist_stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert abs(broadcast_stats["loss"] - plain_stats["loss"]) > 1e-3
