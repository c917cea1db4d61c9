"""An HTTP fuzz suite for the frontend: hypothesis against a real frontend and a real mocker.

One frontend process and one mocker process (``python -m dynamo_trio mocker``
with small token limits, so every generation is short) serve the whole
module; each test sends a hundred generated requests over real HTTP
(httpx, or raw sockets for what httpx will not send).  Invariants, checked
after every request:

* no 5xx (a 503 only for a model without instances, which the mocker never
  is here; an unknown ``Transfer-Encoding`` is a 400, not h11's 501);
* every error the app answers is its API's JSON shape (OpenAI's
  ``{"error": {message, type, param, code}}``, Anthropic's for
  ``/v1/messages``); a request hypercorn's HTTP parser refuses before the app
  sees it gets an empty-bodied 4xx and ``Connection: close``;
* a 200 stream ends the way its API ends (``[DONE]``, ``message_stop``,
  ``response.completed``/``.incomplete``) or with the API's error event;
* no traceback and no ERROR line in the frontend's log;

and after each test: every route still serves a valid request, and at the
end SIGTERM makes the frontend exit 0.
"""

from __future__ import annotations

import contextlib
import json
import socket
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests._fuzz import examples
from tests._memhttp import TLS
from tests._procs import shared_stack

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow

MAX_OUTPUT = 16
FUZZ = settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# ---------------------------------------------------------------------------- the server


MOCKER = (
    "-m",
    "dynamo_trio",
    "mocker",
    "--model-name",
    "mock",
    "--embedding-model-name",
    "mock-embed",
    "--image-model-name",
    "mock-image",
    "--video-model-name",
    "mock-video",
    "--speech-model-name",
    "mock-speech",
    "--media-step-ms",
    "0",
    "--inter-token-latency-ms",
    "0",
    "--context-length",
    "512",
    "--max-output-tokens",
    str(MAX_OUTPUT),
)


class Frontend:
    """The frontend's URL, and its log read so far."""

    def __init__(self, url: str, log: Path):
        self.url = url
        self.log = log
        self._seen = 0

    def assert_clean_log(self) -> None:
        """No traceback or ERROR since the last check."""
        text = self.log.read_text(errors="replace")
        new, self._seen = text[self._seen :], len(text)
        assert "Traceback" not in new, new[-4000:]
        assert " ERROR " not in new, new[-4000:]


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    """The frontend and the mocker, serving the module; at the end a SIGTERM makes the
    frontend exit 0."""
    with shared_stack(
        tmp_path_factory.mktemp("fuzz"),
        worker=MOCKER,
        models=MODELS,
        # A raw head that promises a body it never sends waits this long for its 408.
        overrides={"DYN_HTTP_BODY_TIMEOUT_SECS": "1"},
        sigterm_frontend=True,
    ) as stack:
        yield Frontend(stack.url, stack.frontend_log)


@pytest.fixture(scope="module")
def http(frontend: Frontend) -> Iterator[httpx.Client]:
    with httpx.Client(verify=TLS, base_url=frontend.url, timeout=20) as client:
        yield client


# ---------------------------------------------------------------------------- checking answers

MODELS = {"mock", "mock-embed", "mock-image", "mock-video", "mock-speech"}
ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/audio/speech",
    "/v1/videos",
    "/v1/videos/stream",
]

VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "mock",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    },
    "/v1/completions": {"model": "mock", "prompt": "hi", "max_tokens": 4},
    "/v1/embeddings": {"model": "mock-embed", "input": "hi"},
    "/v1/images/generations": {"model": "mock-image", "prompt": "hi", "size": "8x8"},
    "/v1/images/edits": {
        "model": "mock-image",
        "prompt": "hi",
        "size": "8x8",
        "input_reference": "data:image/png;base64,AA==",
    },
    "/v1/audio/speech": {"model": "mock-speech", "input": "hi"},
    "/v1/videos": {"model": "mock-video", "prompt": "hi", "size": "8x8"},
    "/v1/videos/stream": {"model": "mock-video", "prompt": "hi", "size": "8x8"},
    "/v1/responses": {"model": "mock", "input": "hi", "max_output_tokens": 4},
    "/v1/messages": {
        "model": "mock",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    },
}


def assert_api_error(path: str, status: int, headers: Any, body: bytes) -> None:
    assert headers.get("content-type") == "application/json", (status, headers, body[:300])
    payload = json.loads(body)
    if path == "/v1/messages":
        assert set(payload) == {"type", "error"}, payload
        assert payload["type"] == "error"
        assert set(payload["error"]) == {"type", "message"}, payload
        assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]
    else:
        assert set(payload) == {"error"}, payload
        error = payload["error"]
        assert set(error) == {"message", "type", "param", "code"}, payload
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
    assert b"Traceback" not in body


STREAM_ENDS = {
    "/v1/chat/completions": ("data: [DONE]\n\n", "event: error\n"),
    "/v1/completions": ("data: [DONE]\n\n", "event: error\n"),
    "/v1/responses": (
        "event: response.completed\n",
        "event: response.incomplete\n",
        "event: response.failed\n",
    ),
    "/v1/messages": ("event: message_stop\n", "event: error\n"),
    "/v1/videos": ("data: [DONE]\n\n", "event: error\n"),
}


def check(path: str, response: httpx.Response) -> None:
    status = response.status_code
    assert status < 500, (path, status, response.text[:500])
    if status == 200:
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            text = response.text
            assert any(end in text for end in STREAM_ENDS[path]), text[-500:]
            assert "Traceback" not in text
        elif content_type.startswith("multipart/x-mixed-replace"):
            body = response.content
            assert body.endswith(b"--frame--\r\n") or b"Content-Type: application/json" in body
        elif content_type.startswith("audio/"):
            assert response.content, "an empty audio file"
        else:
            assert isinstance(response.json(), dict)
    else:
        assert_api_error(path, status, response.headers, response.content)


def still_serving(http: httpx.Client, frontend: Frontend) -> None:
    for path, body in VALID.items():
        response = http.post(path, json=body)
        assert response.status_code == 200, (path, response.text)
    frontend.assert_clean_log()


# ---------------------------------------------------------------------------- strategies

BIG_INTS = st.sampled_from(
    [2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30]
)
ODD_FLOATS = st.sampled_from(
    [
        0.0,
        -0.0,
        1e-308,
        5e-324,
        1.7976931348623157e308,
        -1e308,
        float("nan"),
        float("inf"),
        -float("inf"),
    ]
)
ODD_STRINGS = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\ud800",
        "\udfff",
        "\U0001f600",
        "a" * 5000,
        "\u2028\u2029",
        "mock\x00",
        "../../etc/passwd",
        "%s%n",
        "<|assistant|>",
        "\\",
        '"',
        "{}",
        "null",
    ]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | BIG_INTS
    | st.floats()
    | ODD_FLOATS
    | st.text(max_size=20)
    | ODD_STRINGS
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
hostile = json_values | st.builds(
    lambda n: [[]] if n == 0 else json.loads("[" * n + "]" * n), st.integers(60, 80)
)

IMAGE_FIELDS = [
    "model",
    "prompt",
    "n",
    "size",
    "quality",
    "response_format",
    "output_format",
    "output_compression",
    "background",
    "style",
    "user",
    "nvext",
]
VIDEO_FIELDS = [
    "model",
    "prompt",
    "seconds",
    "size",
    "input_reference",
    "response_format",
    "stream",
    "nvext",
]
FIELDS: dict[str, list[str]] = {
    "/v1/chat/completions": [
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "ignore_eos",
        "user",
        "tools",
    ],
    "/v1/completions": [
        "model",
        "prompt",
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "n",
        "best_of",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "echo",
        "logprobs",
        "suffix",
        "logit_bias",
    ],
    "/v1/embeddings": ["model", "input", "encoding_format", "dimensions", "user"],
    "/v1/images/generations": [*IMAGE_FIELDS],
    "/v1/images/edits": [*IMAGE_FIELDS, "input_reference"],
    "/v1/audio/speech": [
        "model",
        "input",
        "voice",
        "response_format",
        "speed",
        "instructions",
        "language",
    ],
    "/v1/videos": [*VIDEO_FIELDS],
    "/v1/videos/stream": [*VIDEO_FIELDS],
    "/v1/responses": [
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "metadata",
        "previous_response_id",
        "conversation",
        "background",
        "store",
    ],
    "/v1/messages": [
        "model",
        "messages",
        "system",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
    ],
}

MESSAGE_FIELDS = ["role", "content"]


@st.composite
def bodies(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A valid body for ``path`` with a few fields made hostile, removed or added."""
    body: dict[str, Any] = json.loads(json.dumps(VALID[path]))
    if path != "/v1/embeddings" and draw(st.booleans()):
        body["stream"] = True
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "delete", "extra", "message"]))
        field = draw(st.sampled_from(FIELDS[path]))
        if action == "set":
            body[field] = draw(hostile)
        elif action == "delete":
            body.pop(field, None)
        elif action == "extra":
            body[draw(st.text(min_size=1, max_size=10))] = draw(hostile)
        elif isinstance(body.get("messages"), list) and body["messages"]:
            message = body["messages"][0]
            if isinstance(message, dict):
                message[draw(st.sampled_from(MESSAGE_FIELDS))] = draw(hostile)
    return body


@st.composite
def encoded(draw: st.DrawFn, body: dict[str, Any]) -> bytes:
    """``body`` as JSON text, sometimes broken in a way a decoder must survive."""
    text = json.dumps(body, allow_nan=True).encode()
    damage = draw(
        st.sampled_from(["none", "none", "none", "truncate", "byte", "duplicate", "deep"])
    )
    if damage == "truncate":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if damage == "byte":
        at = draw(st.integers(0, len(text)))
        return (
            text[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\"]))
            + text[at:]
        )
    if damage == "duplicate":
        return (
            b'{"model": "other", ' + text[1:] if text.startswith(b"{") and len(text) > 2 else text
        )
    if damage == "deep":
        depth = draw(st.integers(60, 2000))
        return (
            b'{"x": ' + b"[" * depth + b"]" * depth + b", " + text[1:]
            if text.startswith(b"{")
            else text
        )
    return text


CONTENT_TYPES = st.sampled_from(
    ["application/json"] * 6
    + [
        "application/json; charset=utf-8",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
        "application/JSON",
        "application/json;;;",
        "*/*",
        "\x7f",
    ]
)


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", ROUTES)
def test_hostile_bodies_on_every_route(path: str, frontend: Frontend, http: httpx.Client) -> None:
    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        body = data.draw(bodies(path))
        content = data.draw(encoded(body))
        content_type = data.draw(CONTENT_TYPES)
        headers = {"content-type": content_type} if content_type.isprintable() else {}
        check(path, http.post(path, content=content, headers=headers))
        frontend.assert_clean_log()

    fuzz()
    still_serving(http, frontend)


@FUZZ
@given(path=st.sampled_from(ROUTES), value=json_values)
def test_any_json_value_as_a_body(
    path: str, value: object, frontend: Frontend, http: httpx.Client
) -> None:
    check(
        path,
        http.post(
            path,
            content=json.dumps(value, allow_nan=True).encode(),
            headers={"content-type": "application/json"},
        ),
    )
    frontend.assert_clean_log()


def test_then_every_route_still_serves(frontend: Frontend, http: httpx.Client) -> None:
    still_serving(http, frontend)


# ---------------------------------------------------------------------------- raw requests

HEADER_NAME = st.text(
    st.sampled_from("abcxyzABC-_0123456789!#$%&'*+.^`|~"), min_size=1, max_size=20
)
HEADER_VALUE = st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
ODD_HEADERS = st.sampled_from(
    [
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: gzip",
        b"Transfer-Encoding: chunked, chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Content-Encoding: gzip",
        b"Content-Encoding: br",
        b"Content-Encoding: identity",
        b"Content-Length: -1",
        b"Content-Length: 1, 2",
        b"Content-Length: 99999999999999999999",
        b"Expect: 100-continue",
        b"Connection: Upgrade",
        b"Upgrade: websocket",
        b"Upgrade: h2c",
        b"Content-Type: application/json",
        b"x-request-id: \xff",
        b"x-request-id: " + b"r" * 300,
        b"Host: a",
        b"Host: b",
        b" Leading: space",
        b"Bad Name: x",
        b"NoColon",
        b"X: a\rb",
    ]
)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    method = draw(
        st.sampled_from(
            [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH", b"FOO", b"G\x00T"]
        )
    )
    path = draw(
        st.sampled_from(
            [*ROUTES, "/v1/models", "/health", "/metrics", "/debug/requests", "*", "/%ff", "//x"]
        )
    )
    path_bytes = path.encode() + draw(
        st.sampled_from([b"", b"?a=1", b"?" + b"q" * 20000, b"/" + b"p" * 3000])
    )
    version = draw(
        st.sampled_from(
            [b"HTTP/1.1"] * 5 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/9.9", b"HTTP/1.1 extra"]
        )
    )
    headers = [b"Host: x"] if draw(st.integers(0, 9)) else []
    for _ in range(draw(st.integers(0, 6))):
        headers.append(draw(HEADER_NAME).encode() + b": " + draw(HEADER_VALUE))
    headers += draw(st.lists(ODD_HEADERS, max_size=3))
    flood = draw(st.sampled_from([0, 0, 0, 500, 3000]))
    headers += [b"X-Flood-%d: y" % i for i in range(flood)]
    body = draw(
        st.sampled_from(
            [b"", json.dumps(VALID["/v1/chat/completions"]).encode(), b"{", b"\xff" * 10]
        )
    )
    if (
        not any(h.lower().startswith((b"content-length", b"transfer-encoding")) for h in headers)
        and body
    ):
        headers.append(b"Content-Length: %d" % len(body))
    return (
        method
        + b" "
        + path_bytes
        + b" "
        + version
        + b"\r\n"
        + b"\r\n".join(headers)
        + b"\r\n\r\n"
        + body
    )


def exchange(url: str, request: bytes) -> tuple[int | None, dict[bytes, bytes], bytes]:
    """Send ``request`` on a new connection; the first final response's status, headers
    and body (status ``None`` if the server closed the connection without answering).

    The client never half-closes: hypercorn takes a client's EOF as a hang-up.
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head_only = request.startswith(b"HEAD ")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with contextlib.suppress(OSError):  # the server may refuse before reading it all
            sock.sendall(request)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            received += chunk
            response = parse_response(received, head_only=head_only, eof=not chunk)
            if response is not None:
                return response
            if not chunk:
                return None, {}, b""


def parse_response(
    data: bytes, *, head_only: bool, eof: bool
) -> tuple[int, dict[bytes, bytes], bytes] | None:
    """The first final response in ``data`` if it is complete, else ``None``."""
    while True:
        head, found, rest = data.partition(b"\r\n\r\n")
        if not found:
            return None
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        if status == 101:
            return status, {}, b""  # switched to another protocol (h2c): nothing more to read
        if 100 <= status < 200:
            data = rest  # an interim response (100 Continue)
            continue
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if head_only or status in (204, 304):
            return status, headers, b""
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            return (status, headers, rest[:length]) if len(rest) >= length else None
        if headers.get(b"transfer-encoding") == b"chunked":
            return (status, headers, rest) if rest.endswith(b"0\r\n\r\n") else None
        return (status, headers, rest) if eof else None


@FUZZ
@given(request=raw_requests())
def test_hostile_request_heads(request: bytes, frontend: Frontend) -> None:
    status, headers, body = exchange(frontend.url, request)
    if status is None:
        return  # closed without an answer: allowed for bytes that are not HTTP
    # Nothing a client sends is a 5xx: a Transfer-Encoding other than one plain
    # "chunked" (h11's 501) is a 400, a Content-Encoding other than identity a 415.
    assert status < 500, (status, request[:300], body[:300])
    if request.startswith(b"HEAD "):
        pass  # no body to check
    elif status >= 400 and body:
        path = request.split(b" ")[1].split(b"?")[0].decode(errors="replace")
        assert_api_error(path, status, {k.decode(): v.decode() for k, v in headers.items()}, body)
    elif status >= 400:
        assert headers.get(b"connection") == b"close", (status, headers)  # hypercorn's parser
    frontend.assert_clean_log()


def test_and_still_serves_after_raw_requests(frontend: Frontend, http: httpx.Client) -> None:
    still_serving(http, frontend)
