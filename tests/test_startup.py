"""A command that cannot serve (a port in use, discovery out of reach) says why in one
line and ends with status 1; a bug keeps its traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import trio

from dynamo_trio._startup import CannotServe, run_command
from dynamo_trio.discovery import DiscoveryError

from ._procs import e2e_environment

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


async def fails_in_tasks(*errors: Exception) -> None:
    """Raise ``errors`` from sibling tasks, one nursery below the run (a group in a group)."""

    async def raise_it(error: Exception) -> None:
        raise error

    async with trio.open_nursery() as outer:

        async def inner() -> None:
            async with trio.open_nursery() as nursery:
                for error in errors:
                    nursery.start_soon(raise_it, error)

        outer.start_soon(inner)


def test_a_cannot_serve_error_ends_the_command_with_its_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_command("prog", fails_in_tasks, CannotServe("port in use"), CannotServe("port in use"))
    assert exited.value.code == 1
    assert capsys.readouterr().err == "prog: error: port in use\n"  # once: the same cause


def test_a_discovery_error_is_one_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_command("prog", fails_in_tasks, DiscoveryError("no etcd"), CannotServe("no port"))
    lines = capsys.readouterr().err.splitlines()
    assert sorted(lines) == ["prog: error: no etcd", "prog: error: no port"]


def test_a_bug_beside_it_keeps_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        run_command("prog", fails_in_tasks, CannotServe("port in use"), KeyError("bug"))
    assert raised.group_contains(KeyError)
    assert capsys.readouterr().err == ""


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(
    ("argv", "settings", "says"),
    [
        (
            ["frontend"],
            {"DYN_HTTP_PORT": "{port}"},
            "cannot listen on 127.0.0.1:{port}: Address already in use",
        ),
        (["mocker", "--model-name", "m"], {"DYN_SYSTEM_PORT": "{port}"}, "cannot listen on"),
        (
            ["mocker", "--model-name", "m"],
            {"DYN_TCP_RPC_PORT": "{port}"},
            "cannot listen for the request plane on 127.0.0.1:{port}",
        ),
        (
            ["mocker", "--model-name", "m"],
            {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": "http://127.0.0.1:1"},
            "cannot register with etcd at http://127.0.0.1:1",
        ),
    ],
)
def test_a_command_that_cannot_serve_says_why_in_one_line(
    tmp_path: Path, taken_port: int, argv: list[str], settings: dict[str, str], says: str
) -> None:
    overrides = {name: value.format(port=taken_port) for name, value in settings.items()}
    done = subprocess.run(
        [sys.executable, "-m", "dynamo_trio", *argv],
        env=e2e_environment(tmp_path, **overrides),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [error] = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert error.startswith(f"dynamo-trio {argv[0]}: error: {says.format(port=taken_port)}")
