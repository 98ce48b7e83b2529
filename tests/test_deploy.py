"""The KubeRay RayJob in deploy/ is well formed and runs a `temper train` Temper accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from temper.config import load_config

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
RAYJOB = ROOT / "deploy" / "kuberay" / "rayjob.yaml"
# Keys the Ray backend adds to the schema (orchestrator.backend = "ray" and its options).
RAY_KEYS = {"backend", "ray_address", "ray_num_cpus", "ray_placement"}


def test_rayjob_runs_temper_train_on_a_ray_cluster():
    job = yaml.safe_load(RAYJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head's CPUs are the trainer's
    (worker_group,) = cluster["workerGroupSpecs"]
    assert worker_group["replicas"] >= 1
    for group in (head, worker_group):
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] and container["resources"]["limits"]["cpu"]
        assert "/dev/shm" in [m["mountPath"] for m in container["volumeMounts"]]

    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["temper", "train"]
    config, overrides = argv[2], argv[3:]
    assert (ROOT / config).is_file()  # the image's working directory is the repository's copy
    ray = {o.split("=", 1)[0].removeprefix("--orchestrator."): o for o in overrides if "ray" in o}
    assert set(ray) == RAY_KEYS
    assert ray["backend"] == "--orchestrator.backend=ray"
    assert ray["ray_address"] == "--orchestrator.ray_address=auto"
    # Everything else must already be a valid Temper config with these overrides.
    rest = [o for o in overrides if o not in ray.values()]
    cfg = load_config(ROOT / config, rest)
    assert cfg.orchestrator.rollout_workers == 4 and str(cfg.run.output_dir) == "/runs"
    # 4 actors of ray_num_cpus CPUs fit the worker pods' Ray CPUs exactly.
    cpus = float(ray["ray_num_cpus"].split("=", 1)[1])
    pods = worker_group["replicas"] * float(worker_group["rayStartParams"]["num-cpus"])
    assert cfg.orchestrator.rollout_workers * cpus == pods
