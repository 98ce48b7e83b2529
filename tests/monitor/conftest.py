"""Fixtures shared by the dashboard tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def vision_runs(tmp_path_factory) -> Path:
    """Runs "vision" and "grid" of the tiny VLM, written by real rollouts (`vision_runs`)."""
    from vision_runs import make_vision_runs

    return make_vision_runs(tmp_path_factory.mktemp("vision-runs"))
