"""HTTP connections: an idle keep-alive connection is closed after the idle timeout
(over memory streams, on the autojump clock)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from tests._memhttp import open_connection

if TYPE_CHECKING:
    from collections.abc import Callable

IDLE_TIMEOUT = 0.5


@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions"])
async def test_an_idle_keep_alive_connection_is_closed(
    stack: Callable[..., Any], path: str, autojump_clock: trio.testing.MockClock
) -> None:
    # hypercorn restarts its idle timer inside the response's last send, which
    # quart-trio's end-of-request cancellation used to cancel: idle connections
    # then stayed open for ever.  The frontend's guard shields that send.
    running = await stack(
        frontend_env={"DYN_HTTP_IDLE_TIMEOUT_SECS": str(IDLE_TIMEOUT)}, memory=True
    )
    stream = await open_connection(running.url)
    if path == "/v1/models":
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    else:
        body = json.dumps({"model": "mock", "prompt": "hi", "max_tokens": 2}).encode()
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
    await stream.send_all(request)
    received = b""
    with trio.fail_after(5):
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):
            chunk = await stream.receive_some(65536)
            assert chunk, received
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    answered = trio.current_time()
    with trio.fail_after(IDLE_TIMEOUT + 3):
        while await stream.receive_some(65536):
            pass  # the server closes the idle connection: EOF
    assert trio.current_time() - answered >= IDLE_TIMEOUT  # virtual time: exact
    await stream.aclose()
