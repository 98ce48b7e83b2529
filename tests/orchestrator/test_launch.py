"""`temper train` under torchrun and mpirun: what the launcher's environment means, and
real launches (two torchrun "nodes" of two ranks each with c10d rendezvous, and mpirun
with two ranks) whose runs match a one-process run; a LoRA run and a DPO run under
torchrun match theirs too."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ports import free_port
from quick_run import LORA_RUN, QUIET, metrics, train
from temper.cli.main import main
from temper.errors import ConfigError
from temper.trainer.launch import check_world_size, detect_launch

COMMON = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.drop_zero_variance_groups=false",
    "--eval.at_start=false",
    "--eval.every=0",
    "--eval.size=16",
    "--eval.k=1",
    "--log.progress=false",
    "--trainer.lr=2e-5",
    "--trainer.warmup_steps=0",
]
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
MPIRUN = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
          "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip


def test_torchrun_environment():
    launch = detect_launch(TORCHRUN)
    assert (launch.launcher, launch.rank, launch.world_size) == ("torchrun", 1, 4)
    assert (launch.local_rank, launch.local_world_size) == (1, 2)
    assert launch.init_method == "env://"  # torchrun's MASTER_ADDR / MASTER_PORT
    pinned = detect_launch(TORCHRUN, master_addr="10.0.0.5", master_port=29600)
    assert pinned.init_method == "tcp://10.0.0.5:29600"  # the config wins


def test_mpirun_environment_needs_an_address():
    with pytest.raises(ConfigError, match=r"set trainer\.master_addr and trainer\.master_port"):
        detect_launch(MPIRUN)
    from_env = detect_launch({**MPIRUN, "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    assert (from_env.rank, from_env.init_method) == (3, "tcp://node0:29500")
    from_cfg = detect_launch(MPIRUN, master_addr="node1", master_port=29501)
    assert from_cfg.init_method == "tcp://node1:29501"


def test_no_launcher_or_a_job_of_one_is_the_plain_path():
    assert detect_launch({}) is None
    assert detect_launch({"RANK": "0", "WORLD_SIZE": "1"}) is None


def test_a_world_size_other_than_the_launchers_is_refused():
    launch = detect_launch(TORCHRUN)
    check_world_size(1, launch)
    check_world_size(4, launch)
    with pytest.raises(ConfigError, match="torchrun started 4 ranks"):
        check_world_size(2, launch)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: the same run in one process (shared by the launcher tests)."""
    out = tmp_path_factory.mktemp("one")
    assert main(["train", f"--run.output_dir={out}", "--run.name=one", *COMMON]) == 0
    return out / "one"


def _matches_one_process(one: Path, launched: Path, ranks: int) -> None:
    m1, m2 = _metrics(one), _metrics(launched)
    assert [m["step"] for m in m2] == [1, 2]
    for key in ("reward_mean", "tokens_generated", "train_tokens"):
        assert m2[0][key] == m1[0][key], key
    for key in ("loss", "grad_norm", "entropy"):
        assert m2[0][key] == pytest.approx(m1[0][key], rel=1e-4, abs=1e-6), key
    ckpt1, ckpt2 = one / "checkpoints" / "step_2", launched / "checkpoints" / "step_2"
    w1 = load_file(str(ckpt1 / "model.safetensors"))
    w2 = load_file(str(ckpt2 / "model.safetensors"))
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4
    assert len(list((ckpt2 / "dcp").glob("*.distcp"))) == ranks  # every rank wrote its shard
    assert torch.load(ckpt2 / "trainer.pt", weights_only=False)["world_size"] == ranks
    e1 = json.loads((one / "eval" / "step_000002.json").read_text())
    e2 = json.loads((launched / "eval" / "step_000002.json").read_text())
    assert e2["accuracy"] == e1["accuracy"]


def _train_args(out: Path) -> list[str]:
    return ["-m", "temper.cli.main", "train", f"--run.output_dir={out}", "--run.name=launched",
            *COMMON]  # fmt: skip


@pytest.mark.slow
def test_two_torchrun_nodes_of_two_ranks_match_one_process(tmp_path, one_process):
    torchrun = Path(sys.executable).parent / "torchrun"
    launch = [str(torchrun), "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=temper-test"]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    nodes = [
        subprocess.Popen(
            [*launch, *_train_args(tmp_path)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    # Exactly one node held global rank 0 and ran the run.
    assert sum("run directory:" in out for out in outputs) == 1
    _matches_one_process(one_process, tmp_path / "launched", ranks=4)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="openmpi-bin (apt-packages.txt)")
def test_mpirun_two_ranks_match_one_process(tmp_path, one_process):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}  # fmt: skip
    cmd = ["mpirun", "-np", "2", "-x", "PATH", "-x", "TOKENIZERS_PARALLELISM", sys.executable,
           *_train_args(tmp_path), "--trainer.master_addr=127.0.0.1",
           f"--trainer.master_port={free_port()}"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _matches_one_process(one_process, tmp_path / "launched", ranks=2)


def _torchrun_one_node(tmp_path: Path, name: str, *overrides: str) -> Path:
    """``temper train`` as two torchrun ranks on this machine; the run directory."""
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "temper.cli.main", "train",
           f"--run.output_dir={tmp_path}", f"--run.name={name}", *QUIET, *overrides]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp_path / name


@pytest.mark.slow
def test_a_torchrun_lora_run_matches_one_process(tmp_path):
    flags = (*LORA_RUN, "--orchestrator.steps=2", "--checkpoint.at_end=true")
    one = train(tmp_path, "one", *flags)
    launched = _torchrun_one_node(tmp_path, "launched", *flags)
    m1, m2 = metrics(one), metrics(launched)
    assert [m["step"] for m in m2] == [1, 2]
    for key in ("reward_mean", "tokens_generated", "train_tokens"):
        assert m2[0][key] == m1[0][key], key
    for key in ("loss", "grad_norm"):
        assert m2[0][key] == pytest.approx(m1[0][key], rel=1e-4, abs=1e-6), key
    # Step 2 sampled on the engine after rank 0 handed it the first adapter update.
    assert m2[1]["train_infer_logprob_diff"] < 1e-3
    ckpt1, ckpt2 = one / "checkpoints" / "step_2", launched / "checkpoints" / "step_2"
    assert not list(ckpt2.glob("model*.safetensors"))  # the adapter, not the model
    a1 = load_file(str(ckpt1 / "adapter_model.safetensors"))
    a2 = load_file(str(ckpt2 / "adapter_model.safetensors"))
    assert a1.keys() == a2.keys() and a1
    # Step 2's batches can differ by sampling on engines that are equal to rounding,
    # so the adapters are compared at the tolerance of two Adam steps, not of one.
    assert max(float((a1[k] - a2[k]).abs().max()) for k in a1) < 1e-3
    assert max(float(a2[k].abs().max()) for k in a2 if "lora_B" in k) > 1e-3  # B moved


DPO = ("--trainer.mode=dpo", "--orchestrator.steps=2", "--orchestrator.prompts_per_step=8",
       "--dpo.size=16", "--dpo.eval_size=16", "--trainer.lr=3e-4", "--trainer.warmup_steps=0",
       "--eval.size=4", "--eval.k=1", "--eval.at_end=true")  # fmt: skip


@pytest.mark.slow
def test_a_torchrun_dpo_run_matches_one_process(tmp_path):
    one = train(tmp_path, "dpo1", *DPO)
    launched = _torchrun_one_node(tmp_path, "dpo2", *DPO)
    m1, m2 = metrics(one), metrics(launched)
    assert [m["step"] for m in m2] == [1, 2]
    for a, b in zip(m1, m2, strict=True):
        for key in ("dpo/loss", "dpo/margin", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    e1 = json.loads((one / "eval" / "step_000002.json").read_text())
    e2 = json.loads((launched / "eval" / "step_000002.json").read_text())
    assert e2["preference_margin"] == pytest.approx(e1["preference_margin"], rel=1e-3)
    assert e2["preference_margin"] > 0
