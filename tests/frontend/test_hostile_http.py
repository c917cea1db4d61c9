"""Hostile HTTP at the frontend's edge: each gets a clean answer, and SIGTERM still exits 0.

A frontend and a worker (the e2e model worker, or the mocker where model limits
matter) over real sockets, in the test's process except where SIGTERM is the
point, driven byte by byte where httpx would refuse to send what a hostile
client sends.  Besides each
test's own checks, the frontend's log must show no traceback and no ERROR.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
import trio
import trio.testing

from dynamo_trio._config import FrontendConfig
from tests._memhttp import http_client

from ._inprocess import CHAT, frontend_with_worker
from .conftest import (
    CHAT_BODY,
    RawConnection,
    assert_anthropic_error,
    assert_openai_error,
    raw_exchange,
    raw_post,
    wait_for_models,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests._serving import Cluster

    from .conftest import StartProcStack, StartStack

pytestmark = pytest.mark.slow

WEBSOCKET_HEADERS = (
    b"Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def assert_clean_log(log: str) -> None:
    """``log``: a frontend process's stderr, or an in-process one's ``Served.log()``."""
    assert "Traceback" not in log, log[-4000:]
    assert " ERROR " not in log, log[-4000:]


def reset(stream: trio.SocketStream) -> None:
    """Make the next close an RST, as a client that vanishes does."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def receive_some_bytes(stream: trio.SocketStream, *, at_least: int) -> bytes:
    received = b""
    with trio.fail_after(30):  # a hang guard only
        while len(received) < at_least:
            chunk = await stream.receive_some(65536)
            assert chunk, received
            received += chunk
    return received


async def open_raw(url: str) -> trio.SocketStream:
    connection = await RawConnection.open(url)
    assert isinstance(connection.stream, trio.SocketStream)  # these tests reset sockets
    return connection.stream


async def still_serving(url: str) -> None:
    async with http_client(url) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 2})
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------------------- HTTP/2

HTTP2 = {"DYN_HTTP_CLEARTEXT_HTTP2": "1"}


def h2_request(
    path: str, json_body: bytes | None = None
) -> tuple[h2.connection.H2Connection, bytes]:
    """A client's first bytes on an HTTP/2 connection: a GET, or a POST of ``json_body``."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    headers = [(":path", path), (":scheme", "http"), (":authority", "x")]
    if json_body is None:
        connection.send_headers(1, [(":method", "GET"), *headers], end_stream=True)
    else:
        headers += [("content-type", "application/json"), ("content-length", str(len(json_body)))]
        connection.send_headers(1, [(":method", "POST"), *headers])
        connection.send_data(1, json_body, end_stream=True)
    return connection, connection.data_to_send()


async def h2_response_body(
    stream: trio.abc.Stream, connection: h2.connection.H2Connection, *, within: float
) -> bytes:
    """Read stream 1's body to its end (granting flow control as it arrives)."""
    body = b""
    ended = False
    with trio.fail_after(within):
        while not ended:
            data = await stream.receive_some(65536)
            assert data
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    body += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, 1)
                ended = ended or isinstance(event, h2.events.StreamEnded)
            await stream.send_all(connection.data_to_send())
    return body


@pytest.mark.parametrize("how", ["h2c-upgrade", "prior-knowledge"])
async def test_an_http2_client_that_vanishes_does_not_stop_sigterm(
    proc_stack: StartProcStack, how: str
) -> None:
    # A long shutdown grace: only a shutdown that is not stuck ends promptly.
    running = await proc_stack(frontend_env={"DYN_SHUTDOWN_GRACE_SECS": "30", **HTTP2})
    for _ in range(3):
        stream = await open_raw(running.url)
        if how == "h2c-upgrade":
            await stream.send_all(
                b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n"
                b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
            )
            received = await receive_some_bytes(stream, at_least=12)
            assert received.startswith(b"HTTP/1.1 101 "), received
        else:
            _, request = h2_request("/v1/models")
            await stream.send_all(request)
            await receive_some_bytes(stream, at_least=9)  # the server's SETTINGS
        reset(stream)  # leaves without reading the answer or speaking HTTP/2 further
        await stream.aclose()
    await trio.sleep(0.3)
    await still_serving(running.url)
    running.frontend.signal(signal.SIGTERM)
    assert await running.frontend.wait_exit(within=20) == 0  # under the grace
    assert_clean_log(running.frontend.stderr.decode(errors="replace"))


async def test_http2_with_prior_knowledge_is_served_when_asked(stack: StartStack) -> None:
    running = await stack(frontend_env=HTTP2)
    stream = await open_raw(running.url)
    connection, request = h2_request("/health")
    await stream.send_all(request)
    body = await h2_response_body(stream, connection, within=30)
    assert json.loads(body)["status"] == "healthy"
    await stream.aclose()


async def test_cleartext_http2_is_refused_unless_asked(stack: StartStack) -> None:
    running = await stack()
    stream = await open_raw(running.url)
    _, request = h2_request("/health")
    await stream.send_all(request)
    received = await receive_some_bytes(stream, at_least=12)
    assert received.startswith(b"HTTP/1.1 505 "), received
    await stream.aclose()
    upgrade = await raw_exchange(
        running.url,
        b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n"
        b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    )
    assert upgrade.status == 200  # the upgrade is ignored: served in HTTP/1.1
    await still_serving(running.url)


async def test_a_rapid_reset_flood_gets_goaway_and_starts_a_bounded_number_of_requests(
    stack: StartStack,
) -> None:
    running = await stack(frontend_env={**HTTP2, "DYN_HTTP2_MAX_RESETS": "20"})
    stream = await open_raw(running.url)
    connection, first = h2_request("/v1/models")
    await stream.send_all(first)
    body = json.dumps({**CHAT_BODY, "max_tokens": 50, "stream": True}).encode()
    goaway = None
    with trio.fail_after(10):
        for stream_id in range(3, 2 * 300, 2):
            connection.send_headers(
                stream_id,
                [
                    (":method", "POST"),
                    (":path", "/v1/chat/completions"),
                    (":scheme", "http"),
                    (":authority", "x"),
                    ("content-type", "application/json"),
                ],
            )
            connection.send_data(stream_id, body, end_stream=True)
            connection.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            try:
                await stream.send_all(connection.data_to_send())
            except trio.BrokenResourceError:
                break
            with trio.move_on_after(0.01):
                data = await stream.receive_some(65536)
                if not data:
                    break
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        goaway = event
            if goaway is not None:
                break
    assert goaway is not None
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    await stream.aclose()
    await still_serving(running.url)
    async with http_client(running.url) as http:
        metrics = (await http.get("/metrics")).text
    started = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("dynamo_frontend_model_cancellation_total{")
    )
    assert started <= 20 + 5, started  # the bound, give or take what one read carried


async def test_an_sse_stream_over_http2_goes_the_usual_way_and_is_whole(
    stack: StartStack,
) -> None:
    # HTTP/2 responses are not chunked: the SSE body hands each piece back to
    # quart (the short way is for HTTP/1.1 only), and the stream arrives whole.
    running = await stack(frontend_env=HTTP2)
    stream = await open_raw(running.url)
    body = json.dumps({**CHAT_BODY, "max_tokens": 40, "stream": True}).encode()
    connection, request = h2_request("/v1/chat/completions", body)
    await stream.send_all(request)
    received = await h2_response_body(stream, connection, within=15)
    await stream.aclose()
    events = [line[6:] for line in received.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    assert sum(1 for piece in text if piece) == 40


# ---------------------------------------------------------------------------- shutdown


async def test_a_client_that_stops_reading_does_not_stop_sigterm(
    proc_stack: StartProcStack,
) -> None:
    # hypercorn shields its socket writes: a stream to a client that reads
    # nothing blocks for ever unless the server closes the socket itself.
    # The grace ends with the connection still stuck: the shorter it is, the sooner.
    running = await proc_stack(
        inter_token_latency_ms=0.05, frontend_env={"DYN_SHUTDOWN_GRACE_SECS": "0.5"}
    )
    stream = await open_raw(running.url)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({**CHAT_BODY, "max_tokens": 16_000, "stream": True}).encode()
    await stream.send_all(raw_post("/v1/chat/completions", body))
    await receive_some_bytes(stream, at_least=100)  # the stream began; now read no more
    await trio.sleep(3)  # the producer runs ahead until the socket buffers are full
    running.frontend.signal(signal.SIGTERM)
    assert await running.frontend.wait_exit(within=30) == 0
    # Exited because the connection was closed at the end of the grace (the log says so),
    # not because the client ever read on.
    assert "closing 1 connection(s) still open" in running.frontend.stderr.decode()
    assert_clean_log(running.frontend.stderr.decode(errors="replace"))
    await stream.aclose()


# ---------------------------------------------------------------------------- WebSocket


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/models", "/health", "/no/such/route"]
)
async def test_a_websocket_handshake_is_refused_with_json(stack: StartStack, path: str) -> None:
    running = await stack()
    for _ in range(2):
        response = await raw_exchange(
            running.url, f"GET {path} HTTP/1.1\r\n".encode() + WEBSOCKET_HEADERS + b"\r\n"
        )
        assert response.status == 404, response.raw
        assert response.headers[b"content-type"] == b"application/json"
        assert response.headers[b"connection"] == b"close"
        body = json.loads(response.body)
        if path == "/v1/messages":
            assert body["type"] == "error"
            assert body["error"]["type"] == "not_found_error"
            message = body["error"]["message"]
        else:
            assert body["error"]["code"] == "websocket_not_supported"
            message = body["error"]["message"]
        assert f"no WebSocket route at {path}" in message
    await still_serving(running.url)
    assert_clean_log(running.log())


# ---------------------------------------------------------------------------- slow bodies


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_that_never_finishes_is_408_after_the_body_timeout_once(
    stack: StartStack, autojump_clock: trio.testing.MockClock, path: str, framing: str
) -> None:
    """The whole stack over memory streams, in virtual time: the 408 comes after exactly
    one body timeout."""
    timeout = 1.0
    running = await stack(frontend_env={"DYN_HTTP_BODY_TIMEOUT_SECS": str(timeout)}, memory=True)
    connection = await RawConnection.open(running.url)
    async with connection.stream:
        length = (
            b"Content-Length: 1000\r\n"
            if framing == "content-length"
            else b"Transfer-Encoding: chunked\r\n"
        )
        start = (
            b'{"model": "mock",' if framing == "content-length" else b'11\r\n{"model": "mock",\r\n'
        )
        await connection.send(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            + length
            + b"\r\n"
            + start
        )
        began = trio.current_time()
        response = await connection.response(within=30)  # a hang guard only
        elapsed = trio.current_time() - began
    assert elapsed == pytest.approx(timeout), elapsed  # once: not a second read to drain it
    assert response.status == 408, response.raw
    assert response.headers[b"connection"] == b"close"
    body = json.loads(response.body)
    if path == "/v1/messages":
        assert body["error"]["type"] == "timeout_error"
    else:
        assert body["error"]["type"] == "timeout_error"
        assert body["error"]["message"] == "The request body did not arrive within 1 seconds."
    await still_serving(running.url)
    assert_clean_log(running.log())


async def _one_token(request: Any, context: Any) -> AsyncIterator[dict[str, Any]]:
    yield {"token_ids": [1]}


@pytest.mark.parametrize("path", [CHAT, "/v1/messages"])
async def test_an_unfinished_body_waits_the_body_timeout_once(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, path: str
) -> None:
    """In virtual time (the app in process, its worker on a memory store): the 408 comes
    after exactly one body timeout, not after the view's read and then a second read to
    drain the body for keep-alive."""
    app = await frontend_with_worker(nursery, _one_token, config=FrontendConfig(body_timeout=1.0))
    headers = {"content-type": "application/json", "content-length": "1000"}
    async with app.test_client().request(path, method="POST", headers=headers) as connection:
        await connection.send(b'{"model": "m",')
        began = trio.current_time()
        response = await connection.as_response()
        elapsed = trio.current_time() - began
    assert response.status_code == 408
    assert response.headers["connection"] == "close"
    assert elapsed == pytest.approx(1.0)


def test_the_body_timeout_is_configured_from_the_environment() -> None:
    from dynamo_trio import Config

    assert Config.from_env({}).frontend.body_timeout == 30.0
    assert Config.from_env({"DYN_HTTP_BODY_TIMEOUT_SECS": "2.5"}).frontend.body_timeout == 2.5
    with pytest.raises(ValueError, match="DYN_HTTP_BODY_TIMEOUT_SECS"):
        Config.from_env({"DYN_HTTP_BODY_TIMEOUT_SECS": "0"})
    for raw in ("0", "257", "x"):
        with pytest.raises(ValueError, match="DYN_HTTP_MAX_JSON_DEPTH"):
            Config.from_env({"DYN_HTTP_MAX_JSON_DEPTH": raw})
    assert Config.from_env({"DYN_HTTP_MAX_HEADER_SIZE": "4096"}).frontend.max_header_size == 4096


# ---------------------------------------------------------------------------- heads


async def test_huge_request_lines_and_header_floods_get_414_or_431(stack: StartStack) -> None:
    limit = 4096
    running = await stack(frontend_env={"DYN_HTTP_MAX_HEADER_SIZE": str(limit)})
    cases: list[tuple[bytes, int]] = [
        (b"GET /" + b"a" * (limit + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health?" + b"q" * limit + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * limit + b"\r\n\r\n", 431),
        (
            b"GET /health HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-%d: y\r\n" % i for i in range(1000))
            + b"\r\n",
            431,
        ),
        (
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Big: "
            + b"v" * limit
            + b"\r\n\r\n{}",
            431,
        ),
    ]
    for request, status in cases:
        response = await raw_exchange(running.url, request)
        assert response.status == status, response.raw[:300]
        assert response.headers[b"connection"] == b"close"
        error = json.loads(response.body)["error"]
        assert f"the limit is {limit} bytes" in error["message"]
    # Just under the limit is served.
    response = await raw_exchange(
        running.url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 3000 + b"\r\n\r\n"
    )
    assert response.status == 200
    # A head that keeps coming is cut off by the parser, without waiting for its end.
    stream = await open_raw(running.url)
    await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    answer = b""
    with trio.fail_after(30):  # a hang guard only
        for _ in range(100):
            try:
                await stream.send_all(b"X-Flood: " + b"f" * 1000 + b"\r\n")
            except trio.BrokenResourceError:
                break
            with trio.move_on_after(0.01):
                answer += await stream.receive_some(65536)
            if answer:
                break
    assert answer.startswith(b"HTTP/1.1 431 ") or answer == b"", answer
    await stream.aclose()
    await still_serving(running.url)
    assert_clean_log(running.log())


async def test_an_early_answer_to_a_client_that_keeps_sending_is_clean(
    stack: StartStack,
) -> None:
    # The answer (a 414 from the gate, before the body is read) races the
    # reading task, which meets the bytes past the body, gives up on the
    # connection and sends EOF; hypercorn's unlocked send_eof then collided
    # with the answer's send_all (BusyResourceError, "Error in ASGI Framework").
    running = await stack(frontend_env={"DYN_HTTP_MAX_HEADER_SIZE": "4096"})
    request = (
        b"POST /v1/chat/completions?" + b"q" * 5000 + b" HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 5\r\n\r\n{" + b"x" * 100_000
    )
    for _ in range(30):
        stream = await open_raw(running.url)
        answer = b""
        with trio.fail_after(30):  # a hang guard only
            try:
                await stream.send_all(request)
                while chunk := await stream.receive_some(65536):
                    answer += chunk
            except trio.BrokenResourceError:
                pass  # the server closed with our bytes unread: a reset
        assert answer.startswith(b"HTTP/1.1 414 ") or not answer, answer[:200]
        await stream.aclose()
    await still_serving(running.url)
    assert_clean_log(running.log())


# ---------------------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"],
)
async def test_hostile_bodies_get_precise_400s(stack: StartStack, path: str) -> None:
    running = await stack()
    model = "mock-embed" if path == "/v1/embeddings" else "mock"
    cases: list[tuple[bytes, str, str | None]] = [
        (b"[" * 1000 + b"]" * 1000, "more than 64 levels deep", None),
        (b'{"a":' * 1000 + b"1" + b"}" * 1000, "more than 64 levels deep", None),
        (b'{"model": "%s", "model": "other"}' % model.encode(), "the key 'model' appears", None),
        (b'{"model": "\\ud800"}', "half of a UTF-16 surrogate pair", None),
        (b'{"model": "\xff"}', "not UTF-8", None),
        (b'{"model": "m", "seed": %d}' % 2**64, "between -2**63 and 2**64-1", "seed"),
        (b'{"model": "m", "temperature": NaN}', "NaN and Infinity", "temperature"),
        (b'{"model": "m", "top_p": 1e999}', "too large to represent", None),
    ]
    async with http_client(running.url) as http:
        for body, expected, param in cases:
            response = await http.post(
                path, content=body, headers={"content-type": "application/json"}
            )
            if path == "/v1/messages":
                message = assert_anthropic_error(response, 400, "invalid_request_error")
            else:
                error = assert_openai_error(response, 400, "invalid_request_error", param=param)
                message = error["message"]
            assert expected in message
        # Charsets other than UTF-8 are not JSON.
        response = await http.post(
            path,
            content=b"{}",
            headers={"content-type": "application/json; charset=iso-8859-1"},
        )
        assert response.status_code == 415
    await still_serving(running.url)
    assert_clean_log(running.log())


# ---------------------------------------------------------------------------- model limits


async def mocker_stack(cluster: Cluster, *mocker_flags: str) -> str:
    """A mocker (as ``python -m dynamo_trio mocker``) and a frontend; the frontend's URL."""
    await cluster.mocker(
        "--model-name",
        "mock",
        "--embedding-model-name",
        "mock-embed",
        "--inter-token-latency-ms",
        "0",
        *mocker_flags,
    )
    url = await cluster.frontend()
    await wait_for_models(url, {"mock", "mock-embed"}, within=15)
    return url


LONG_PROMPT = "word " * 40  # 40 pseudo-tokens, plus the chat template's

TOO_MANY: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 33}, "max_tokens"),
    (
        "/v1/chat/completions",
        {**CHAT_BODY, "max_completion_tokens": 2**31},
        "max_completion_tokens",
    ),
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 2**63}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 2**64 - 1}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT_BODY, "min_tokens": 100}, "min_tokens"),
    ("/v1/completions", {"model": "mock", "prompt": "hi", "max_tokens": 10**12}, "max_tokens"),
    (
        "/v1/responses",
        {"model": "mock", "input": "hi", "max_output_tokens": 33},
        "max_output_tokens",
    ),
]

TOO_LONG: list[tuple[str, dict[str, Any], str]] = [
    (
        "/v1/chat/completions",
        {"model": "mock", "max_tokens": 32, "messages": [{"role": "user", "content": LONG_PROMPT}]},
        "messages",
    ),
    ("/v1/completions", {"model": "mock", "max_tokens": 32, "prompt": LONG_PROMPT}, "prompt"),
    ("/v1/responses", {"model": "mock", "max_output_tokens": 32, "input": LONG_PROMPT}, "input"),
    (
        "/v1/chat/completions",
        {"model": "mock", "messages": [{"role": "user", "content": LONG_PROMPT * 2}]},
        "messages",
    ),
    ("/v1/embeddings", {"model": "mock-embed", "input": LONG_PROMPT * 2}, "input"),
]


async def test_token_limits_come_from_the_model_card(cluster: Cluster) -> None:
    url = await mocker_stack(cluster, "--context-length", "64", "--max-output-tokens", "32")
    async with http_client(url) as http:
        for path, body, param in TOO_MANY:
            for stream in (False, True):
                payload = {**body, "stream": True} if stream and path != "/v1/embeddings" else body
                response = await http.post(path, json=payload)
                error = assert_openai_error(
                    response, 400, "invalid_request_error", param=param, code="invalid_value"
                )
                value = body[param]
                assert error["message"] == (
                    f"{param} is too large: {value}. This model supports at most 32 completion "
                    f"tokens, whereas you provided {value}."
                )
        response = await http.post("/v1/messages", json={**CHAT_BODY, "max_tokens": 2**40})
        assert assert_anthropic_error(response, 400, "invalid_request_error") == (
            f"max_tokens: {2**40} > 32, which is the maximum allowed number of output tokens "
            "for mock"
        )
        # Prompt plus output over the context: the engine counts, the frontend answers 400.
        for path, body, param in TOO_LONG:
            for stream in (False, True):
                payload = {**body, "stream": True} if stream and path != "/v1/embeddings" else body
                response = await http.post(path, json=payload)
                error = assert_openai_error(
                    response,
                    400,
                    "invalid_request_error",
                    param=param,
                    code="context_length_exceeded",
                )
                assert error["message"].startswith(
                    "This model's maximum context length is 64 tokens. However, "
                )
        response = await http.post(
            "/v1/messages",
            json={
                "model": "mock",
                "max_tokens": 32,
                "messages": [{"role": "user", "content": LONG_PROMPT}],
            },
        )
        message = assert_anthropic_error(response, 400, "invalid_request_error")
        assert message.startswith("This model's maximum context length is 64 tokens.")
        # At the limits, requests are served.
        response = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 32})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 32
    assert_clean_log(cluster.log.text())
