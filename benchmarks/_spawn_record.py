"""A pytest plugin for ``suite.py``: records which tests start a process.

Every ``fork_exec`` (what ``subprocess``, ``trio.lowlevel.open_process`` and
multiprocessing's spawn all end in) and every ``os.fork`` made while a test runs
(its fixtures included) appends the test's node id to ``$DYN_BENCH_SPAWN_LOG``.
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
_current: list[str] = []


def _recorded(start: Callable[..., Any]) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        if _current and _LOG:
            with open(_LOG, "a") as log:
                log.write(_current[0] + "\n")
        return start(*args, **kwargs)

    return record


_posixsubprocess.fork_exec = _recorded(_posixsubprocess.fork_exec)
if hasattr(subprocess, "_fork_exec"):  # 3.11+: its own reference to fork_exec
    subprocess._fork_exec = _recorded(subprocess._fork_exec)
os.fork = _recorded(os.fork)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current[:] = [item.nodeid]
    yield
    _current.clear()
