"""A pytest plugin for ``suite.py``: records which tests start a process.

Every ``fork_exec`` (what ``subprocess``, ``trio.lowlevel.open_process`` and
multiprocessing's spawn all end in) and every ``os.fork`` made while a test runs
appends a line to ``$DYN_BENCH_SPAWN_LOG``: ``test NODEID``, or ``fixture NAME`` when a
fixture's setup made it (a shared fixture starts its process for every test using
it).  Each test's fixtures are logged too (``uses NODEID NAME...``).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

_LOG = os.environ.get("DYN_BENCH_SPAWN_LOG", "")
_current: list[str] = []  # "test NODEID", then "fixture NAME" while a fixture sets up


def _write(line: str) -> None:
    if _LOG:
        with open(_LOG, "a") as log:
            log.write(line + "\n")


def _recorded(start: Callable[..., Any]) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        if _current:
            _write(_current[-1])
        return start(*args, **kwargs)

    return record


_posixsubprocess.fork_exec = _recorded(_posixsubprocess.fork_exec)
if hasattr(subprocess, "_fork_exec"):  # 3.11+: its own reference to fork_exec
    subprocess._fork_exec = _recorded(subprocess._fork_exec)
os.fork = _recorded(os.fork)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _write(" ".join(["uses", item.nodeid.replace(" ", "_"), *getattr(item, "fixturenames", ())]))
    _current[:] = [f"test {item.nodeid}"]
    yield
    _current.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Iterator[None]:
    _current.append(f"fixture {fixturedef.argname}")
    try:
        yield
    finally:
        _current.pop()
