"""Fixtures for the vision tests: one random tiny LLaVA per session (`tiny_llava`)."""

from __future__ import annotations

import pytest

from tiny_llava import build_tiny_llava


@pytest.fixture(scope="session")
def llava_path(tmp_path_factory):
    return build_tiny_llava(tmp_path_factory.mktemp("llava"))
