"""The engine tests: bridges with fake engines here; real engines where they are installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.runtime.conftest import cluster as cluster

from ._tiny_model import write_tiny_model

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint directory, made once per session (needs torch)."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
