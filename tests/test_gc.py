"""The serving processes' garbage-collector settings (:mod:`dynamo_trio._gc`)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from dynamo_trio import Config
from dynamo_trio._config import add_flags, config_from_args
from dynamo_trio._gc import DEFAULT_GEN0_THRESHOLD, tune_gc

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_what_exists_and_raises_only_the_youngest_threshold() -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    old = gc.get_threshold()
    gc.unfreeze()
    garbage = Cycle()
    del garbage  # cyclic garbage: collected before the freeze, never frozen
    alive = [Cycle()]
    tune_gc(5000)
    assert gc.get_threshold() == (5000, old[1], old[2])
    assert gc.get_freeze_count() > 0
    assert not any(isinstance(obj, Cycle) for obj in gc.get_objects())  # all frozen or freed
    assert alive[0].me is alive[0]


@pytest.mark.usefixtures("restored_gc")
def test_zero_leaves_the_collector_as_python_set_it() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    tune_gc(0)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError, match="0 or more"):
        tune_gc(-1)


def test_the_setting_comes_from_the_environment_and_the_command_line() -> None:
    import argparse

    assert Config.from_env({}).gc_threshold == DEFAULT_GEN0_THRESHOLD
    assert Config.from_env({"DYN_GC_THRESHOLD": "0"}).gc_threshold == 0
    with pytest.raises(ValueError, match="DYN_GC_THRESHOLD"):
        Config.from_env({"DYN_GC_THRESHOLD": "-5"})
    parser = argparse.ArgumentParser()
    add_flags(parser)
    given = parser.parse_args(["--gc-threshold", "2500"])
    assert config_from_args(given, {}).gc_threshold == 2500
    assert config_from_args(parser.parse_args([]), {}).gc_threshold == DEFAULT_GEN0_THRESHOLD
    with pytest.raises(ValueError, match="0 or more"):
        Config(gc_threshold=-1)


def _python(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin", "DYN_DISCOVERY_BACKEND": "mem"},
    )
    return done.stdout


_SERVE = [
    ("frontend", []),
    ("mocker", ["--model-name", "m"]),
    ("run", []),
]


# Each serving command with a threshold of its own; the setting's default and 0 once (one
# parser for every command: test_the_setting_comes_from_the_environment_and_the_command_line).
_CASES = [(entry, required, ["--gc-threshold", "1234"]) for entry, required in _SERVE] + [
    ("mocker", ["--model-name", "m"], []),
    ("mocker", ["--model-name", "m"], ["--gc-threshold", "0"]),
]


@pytest.mark.parametrize(("entry", "required", "argv"), _CASES)
def test_the_serving_processes_apply_it_before_serving(
    entry: str, required: list[str], argv: list[str]
) -> None:
    """The frontend, the mocker and ``run`` tune their process's collector before they serve.
    quart-trio and flask load before that in the processes that serve HTTP, so they are
    frozen with the rest; a mock worker, started by the dozen, does without them."""
    script = textwrap.dedent(
        f"""
        import gc, sys, trio
        from dynamo_trio.cli import main

        def report(*args, **kwargs):
            quart = sys.modules.get("quart.app")
            frozen = quart is not None and all(o is not quart.Quart for o in gc.get_objects())
            print(gc.get_threshold()[0], gc.get_freeze_count() > 0)
            print("quart" in sys.modules, "flask" in sys.modules, frozen)

        trio.run = report
        main(["{entry}", *sys.argv[1:]])
        """
    )
    tuned, modules = _python("-c", script, *required, *argv).splitlines()
    threshold, frozen = tuned.split()
    if argv[1:] == ["0"]:
        pythons_own = int(_python("-c", "import gc; print(gc.get_threshold()[0])"))
        assert (int(threshold), frozen) == (pythons_own, "False")
        return
    expected = int(argv[1]) if argv else DEFAULT_GEN0_THRESHOLD
    assert (int(threshold), frozen) == (expected, "True")
    serves_http = entry != "mocker"
    assert modules == " ".join([str(serves_http)] * 3)
