"""Fixtures for the request plane's trio-level tests."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from dynamo_trio.request_plane._connection import limited_log

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(autouse=True)
def fresh_log_limiter() -> Iterator[None]:
    """Each test sees the first rate-limited line of every kind."""
    limited_log.reset()
    yield
    limited_log.reset()


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail the test if the request plane logged an ERROR: a hostile peer may cause
    WARNING lines (rate-limited), never an internal error."""
    caplog.set_level(logging.INFO, logger="dynamo_trio")
    yield
    errors = [
        record.getMessage()
        for phase in ("setup", "call")
        for record in caplog.get_records(phase)
        if record.levelno >= logging.ERROR and record.name.startswith("dynamo_trio")
    ]
    assert not errors, errors
