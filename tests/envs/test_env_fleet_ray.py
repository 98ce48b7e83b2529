"""A training run whose env servers are Ray actors (`env.ray_servers`): one dies mid-run
and no episode is lost or trained as a zero; its episodes are retried on the other."""

from __future__ import annotations

import time
from pathlib import Path

from env_servers import COUNTER
from quick_run import metrics, train


def test_a_run_on_ray_env_servers_survives_losing_one(ray_cluster, tmp_path):
    died = tmp_path / "died"
    options = f'{{turns=2,die_once_file="{died}"}}'  # TOML, no spaces: one argument
    run = train(
        tmp_path, "ray-fleet",
        f"--env.type={COUNTER}", f"--env.options={options}", "--env.ray_servers=2",
        "--orchestrator.steps=2", "--orchestrator.prompts_per_step=2",
        "--orchestrator.group_size=2", "--orchestrator.max_response_tokens=8",
        "--orchestrator.drop_zero_variance_groups=false", "--env.limits.continue_after_length=true",
    )  # fmt: skip
    assert died.exists()  # one server process died at its first step
    rows = metrics(run)
    assert [r["env/episodes"] for r in rows] == [4.0, 4.0]  # no episode lost
    assert sum(r.get("env/infra_retries", 0.0) for r in rows) >= 1
    assert all(r.get("env/finish/infra_error", 0.0) == 0 for r in rows)
    assert all(r["env/finish/done"] == 4.0 for r in rows)
    assert all(r["reward_mean"] == 1.0 for r in rows)  # two turns of 0.5, never a zero
    # The actors are gone with the run: one died, the run stopped the other.
    deadline = time.monotonic() + 60
    while actor_processes():
        assert time.monotonic() < deadline, f"env-server actors left: {actor_processes()}"
        time.sleep(0.1)


def actor_processes() -> list[str]:
    """Processes Ray titled as env-server actors (``ray::EnvServerActor...``)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("ray::EnvServerActor"):
            found.append(f"{proc.name}: {cmdline[:60]}")
    return found
