"""The fault settings, without processes: where they come from and what they refuse.

``--migration-limit``/``DYN_MIGRATION_LIMIT``, the backend inactivity timeout,
the server's maximum request timeout and the dead-client bound are read from
the environment and the command line, and refuse what is not a setting; the
``x-request-timeout`` header parser (fuzzed) either gives a deadline within the
server's maximum or a 400 naming the header; the socket options that find a
silent client keep within the bound they are given.
"""

from __future__ import annotations

import math
import socket

import pytest
from hypothesis import given, strategies as st

from dynamo_trio import Config
from dynamo_trio._config import add_flags, config_from_args
from dynamo_trio.edge import dead_peer_options
from dynamo_trio.frontend._routes import REQUEST_TIMEOUT_HEADER, request_deadline
from dynamo_trio.llm import RequestError


def test_the_defaults_are_dynamos_and_the_bound_is_within_15_seconds() -> None:
    frontend = Config.from_env({}).frontend
    assert frontend.migration_limit == 0  # as in Dynamo: opt in
    assert frontend.backend_stream_timeout == 0.0
    assert frontend.max_request_timeout == 0.0
    assert 0 < frontend.dead_client_timeout <= 15


def test_the_environment_sets_them() -> None:
    frontend = Config.from_env(
        {
            "DYN_MIGRATION_LIMIT": "3",
            "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS": "2.5",
            "DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS": "600",
            "DYN_HTTP_DEAD_CLIENT_SECS": "0",
        }
    ).frontend
    assert frontend.migration_limit == 3
    assert frontend.backend_stream_timeout == 2.5
    assert frontend.max_request_timeout == 600.0
    assert frontend.dead_client_timeout == 0.0


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("DYN_MIGRATION_LIMIT", "-1"),
        ("DYN_MIGRATION_LIMIT", "1.5"),
        ("DYN_MIGRATION_LIMIT", "many"),
        ("DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS", "-1"),
        ("DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS", "inf"),
        ("DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS", "nan"),
        ("DYN_HTTP_DEAD_CLIENT_SECS", "soon"),
    ],
)
def test_the_environment_refuses_what_is_not_a_setting(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name):
        Config.from_env({name: raw})


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv("DYN_MIGRATION_LIMIT", "1")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        ["--migration-limit", "4", "--backend-stream-timeout", "7", "--dead-client-timeout", "5"]
    )
    frontend = config_from_args(args).frontend
    assert (frontend.migration_limit, frontend.backend_stream_timeout) == (4, 7.0)
    assert (frontend.max_request_timeout, frontend.dead_client_timeout) == (0.0, 5.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--migration-limit", "-2"],
        ["--backend-stream-timeout", "-1"],
        ["--dead-client-timeout", "inf"],
        ["--max-request-timeout", "nan"],
    ],
)
def test_the_command_line_refuses_bad_values_with_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from dynamo_trio.frontend._main import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "error" in capsys.readouterr().err


@given(
    raw=st.one_of(st.none(), st.text(max_size=40), st.floats().map(str)),
    max_timeout=st.sampled_from([0.0, 0.5, 30.0]),
)
def test_the_request_timeout_header_is_a_deadline_within_the_maximum_or_a_400(
    raw: str | None, max_timeout: float
) -> None:
    now = 1000.0
    try:
        deadline = request_deadline(raw, max_timeout, now)
    except RequestError as exc:
        refused: RequestError | None = exc
    else:
        refused = None
    if refused is not None:
        assert raw is not None
        assert (refused.status, refused.param) == (400, REQUEST_TIMEOUT_HEADER)
        return
    if deadline is None:
        assert raw is None and max_timeout == 0
        return
    assert now <= deadline < math.inf  # a timeout too small to add to now is already over
    if max_timeout:
        assert deadline <= now + max_timeout
    if raw is not None:
        assert deadline <= now + float(raw)


def test_the_request_timeout_header_examples() -> None:
    assert request_deadline(None, 0.0, 10.0) is None
    assert request_deadline(None, 5.0, 10.0) == 15.0  # the maximum is the default
    assert request_deadline("2.5", 0.0, 10.0) == 12.5
    assert request_deadline("60", 5.0, 10.0) == 15.0  # cut to the maximum
    for bad in ("", "0", "-1", "nan", "inf", "1e999", "soon", "1 s"):
        with pytest.raises(RequestError):
            request_deadline(bad, 5.0, 10.0)


@pytest.mark.parametrize("bound", [1.0, 2.0, 3.0, 10.0, 15.0, 60.0])
def test_the_dead_peer_options_find_a_silent_peer_within_the_bound(bound: float) -> None:
    options = {(level, option): value for level, option, value in dead_peer_options(bound)}
    assert options[socket.SOL_SOCKET, socket.SO_KEEPALIVE] == 1
    idle = options[socket.IPPROTO_TCP, socket.TCP_KEEPIDLE]
    interval = options[socket.IPPROTO_TCP, socket.TCP_KEEPINTVL]
    count = options[socket.IPPROTO_TCP, socket.TCP_KEEPCNT]
    # The last unanswered probe ends the connection: at most a probe past the bound.
    assert idle + interval * count <= bound + interval
    assert options[socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT] == round(bound * 1000)
    # The kernel accepts them all.
    with socket.socket() as sock:
        for (level, option), value in options.items():
            sock.setsockopt(level, option, value)
