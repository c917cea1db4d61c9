"""``python -m dynamo_trio transformers|vllm``: refused with a clear line, never a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests._procs import e2e_environment
from tests.e2e.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path


def command(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dynamo_trio", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_a_model_that_is_not_a_directory_is_refused(engine: str, tmp_path: Path) -> None:
    done = command(engine, "--model", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "not a directory" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("engine", "library"), [("transformers", "torch"), ("vllm", "vllm")])
def test_a_missing_engine_library_is_named(engine: str, library: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(library) is not None:
        pytest.skip(f"{library} is installed here")
    done = command(engine, "--model", str(tmp_path))
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if "this worker needs" in line]
    assert library in line
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("engine", "library"), [("transformers", "torch"), ("vllm", "vllm")])
def test_a_directory_without_a_model_ends_the_worker_with_one_line(
    engine: str, library: str, tmp_path: Path
) -> None:
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed here")
    (tmp_path / "empty").mkdir()
    done = command(engine, "--model", str(tmp_path / "empty"), env=e2e_environment(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert line.startswith(f"dynamo-trio {engine}: error: ")
    assert str(tmp_path / "empty") in line


def test_the_commands_are_listed() -> None:
    done = command("--help")
    assert done.returncode == 0
    assert "transformers" in done.stdout and "vllm" in done.stdout
