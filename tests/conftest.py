"""Settings for the whole suite: hypothesis judges examples by what they find, not by how
long a busy machine takes to run them (no per-example deadline, no too-slow check), and
every property test is marked ``fuzz`` (``nox -s fuzz`` runs those at full budget)."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from tests._fuzz import examples

if TYPE_CHECKING:
    from collections.abc import Iterator

settings.register_profile(
    "suite",
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("suite")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "obj", None)
        if getattr(test, "is_hypothesis_test", False) or item.get_closest_marker("fuzz"):
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture
def collect_garbage_at_exit() -> Iterator[None]:
    """A collection as the test ends: what it left to the collector is finalized under its
    own warning filters, not in whichever test the collector next runs in."""
    yield
    gc.collect()
