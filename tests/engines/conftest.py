"""The engine tests: bridges with fake engines here; real engines where they are installed."""

from __future__ import annotations

from tests.runtime.conftest import cluster as cluster
