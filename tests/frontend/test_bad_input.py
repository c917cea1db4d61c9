"""Bad input: the right status, an API-shaped JSON error, and the frontend serves on (SPEC §6).

OpenAI routes answer ``{"error": {"message", "type", "param", "code"}}``;
``/v1/messages`` answers Anthropic's ``{"type": "error", "error": {"type",
"message"}}``.  No response body ever carries a traceback, and no refused
request reaches the worker.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from tests._memhttp import http_client

from .conftest import (
    CHAT_BODY,
    RawConnection,
    assert_anthropic_error,
    assert_openai_error,
    raw_post,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx

    from tests._serving import Served

    from .conftest import StartStack

OPENAI_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
ALL_ROUTES = [*OPENAI_ROUTES, "/v1/messages"]

VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {**CHAT_BODY, "max_tokens": 1},
    "/v1/completions": {"model": "mock", "prompt": "hi", "max_tokens": 1},
    "/v1/embeddings": {"model": "mock-embed", "input": "hi"},
    "/v1/responses": {"model": "mock", "input": "hi", "max_output_tokens": 1},
    "/v1/messages": {**CHAT_BODY, "max_tokens": 1},
}


def assert_api_error(response: httpx.Response, path: str, status: int, **expected: Any) -> None:
    """The error shape of ``path``'s API; ``expected`` pins OpenAI ``type``/``param``/``code``."""
    if path == "/v1/messages":
        anthropic_type = expected.pop("anthropic_type", "invalid_request_error")
        assert_anthropic_error(response, status, anthropic_type)
    else:
        expected.pop("anthropic_type", None)
        error_type = expected.pop("type", "invalid_request_error")
        assert_openai_error(response, status, error_type, **expected)
    assert "x-request-id" in response.headers


async def assert_still_serving(running: Served) -> None:
    """Every route still answers a valid request, and only those reached the worker."""
    async with http_client(running.url) as http:
        for path, body in VALID.items():
            response = await http.post(path, json=body)
            assert response.status_code == 200, (path, response.text)
    starts = [event for event in running.worker.events if event["event"] == "start"]
    assert len(starts) == len(VALID), starts


async def test_malformed_json_is_400(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        for path in ALL_ROUTES:
            for body in (b'{"model": "mock",', b"", b"\xff\xfe\x00", b"{'single': 'quotes'}"):
                response = await http.post(
                    path, content=body, headers={"content-type": "application/json"}
                )
                assert_api_error(response, path, 400, param=None, code=None)
                assert "not valid JSON" in response.text
    await assert_still_serving(running)


async def test_json_that_is_not_an_object_is_400(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        for path in ALL_ROUTES:
            for body, described in (([1, 2], "an array"), ("hi", "a string"), (3, "an integer")):
                response = await http.post(path, json=body)
                assert_api_error(response, path, 400, param=None, code="invalid_type")
                assert f"expected an object, but got {described}" in response.text
            response = await http.post(
                path, content=b"null", headers={"content-type": "application/json"}
            )
            assert_api_error(response, path, 400, param=None, code="invalid_type")
    await assert_still_serving(running)


# (route, body, param, code): each refused before it reaches a worker.
INVALID_FIELDS: list[tuple[str, dict[str, Any], str, str]] = [
    ("/v1/chat/completions", {"model": "mock"}, "messages", "missing_required_parameter"),
    ("/v1/chat/completions", {**CHAT_BODY, "model": 5}, "model", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_BODY, "model": ""}, "model", "invalid_value"),
    ("/v1/chat/completions", {"model": "mock", "messages": "hi"}, "messages", "invalid_type"),
    (
        "/v1/chat/completions",
        {"model": "mock", "messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        "invalid_type",
    ),
    (
        "/v1/chat/completions",
        {"model": "mock", "messages": [{"role": "robot", "content": "hi"}]},
        "messages[0].role",
        "invalid_value",
    ),
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": "3"}, "max_tokens", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": True}, "max_tokens", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ("/v1/chat/completions", {**CHAT_BODY, "temperature": 3}, "temperature", "invalid_value"),
    ("/v1/chat/completions", {**CHAT_BODY, "stream": "yes"}, "stream", "invalid_type"),
    (
        "/v1/chat/completions",
        {**CHAT_BODY, "stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
    ),
    ("/v1/chat/completions", {**CHAT_BODY, "n": 2}, "n", "unsupported_value"),
    ("/v1/completions", {"model": "mock"}, "prompt", "missing_required_parameter"),
    ("/v1/completions", {"model": "mock", "prompt": ["a", "b"]}, "prompt", "unsupported_value"),
    ("/v1/completions", {"model": "mock", "prompt": [1, 2]}, "prompt", "unsupported_value"),
    ("/v1/embeddings", {"model": "mock-embed"}, "input", "missing_required_parameter"),
    ("/v1/embeddings", {"model": "mock-embed", "input": ""}, "input", "invalid_value"),
    (
        "/v1/embeddings",
        {"model": "mock-embed", "input": "hi", "encoding_format": "hex"},
        "encoding_format",
        "invalid_value",
    ),
    ("/v1/responses", {"model": "mock"}, "input", "missing_required_parameter"),
    (
        "/v1/responses",
        {"model": "mock", "input": "hi", "previous_response_id": "resp_1"},
        "previous_response_id",
        "unsupported_value",
    ),
    (
        "/v1/responses",
        {"model": "mock", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "input[0].content[0].type",
        "unsupported_value",
    ),
]


async def test_wrong_types_and_missing_fields_are_400_naming_the_parameter(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        for path, body, param, code in INVALID_FIELDS:
            response = await http.post(path, json=body)
            assert_api_error(response, path, 400, param=param, code=code)
            assert f"'{param}'" in response.json()["error"]["message"]
        # Anthropic: max_tokens is required, and only user/assistant turns exist.
        for body, param in (
            (CHAT_BODY, "max_tokens"),
            ({**CHAT_BODY, "max_tokens": "many"}, "max_tokens"),
            (
                {
                    "model": "mock",
                    "max_tokens": 5,
                    "messages": [{"role": "system", "content": "x"}],
                },
                "messages[0].role",
            ),
        ):
            response = await http.post("/v1/messages", json=body)
            assert f"'{param}'" in assert_anthropic_error(response, 400, "invalid_request_error")
        # Not finite: JSON's NaN is refused, not passed on.
        response = await http.post(
            "/v1/chat/completions",
            content=json.dumps({**CHAT_BODY, "temperature": float("nan")}).encode(),
            headers={"content-type": "application/json"},
        )
        assert_api_error(response, "/v1/chat/completions", 400, param="temperature")
    await assert_still_serving(running)


async def test_an_argument_the_worker_refuses_is_400(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        response = await http.post(
            "/v1/embeddings", json={"model": "mock-embed", "input": "hi", "dimensions": 999}
        )
    assert_api_error(response, "/v1/embeddings", 400, param=None)
    assert "dimensions (999)" in response.json()["error"]["message"]
    await running.worker.wait_for("exit", id=response.headers["x-request-id"])
    running.worker.events.clear()
    await assert_still_serving(running)


async def test_an_unknown_model_is_404(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        for path in ALL_ROUTES:
            for stream in (False, True):
                body = {**VALID[path], "model": "no-such-model"}
                if path != "/v1/embeddings":
                    body["stream"] = stream
                response = await http.post(path, json=body)
                assert_api_error(
                    response,
                    path,
                    404,
                    type="not_found_error",
                    anthropic_type="not_found_error",
                    param="model",
                    code="model_not_found",
                )
                assert "`no-such-model` does not exist" in response.text
    await assert_still_serving(running)


async def test_a_model_of_another_type_is_404_naming_what_it_serves(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    cases = [
        ("/v1/chat/completions", "mock-embed", "chat", "embeddings"),
        ("/v1/completions", "slow-embed", "completions", "embeddings"),
        ("/v1/responses", "mock-embed", "chat", "embeddings"),
        ("/v1/messages", "mock-embed", "chat", "embeddings"),
        ("/v1/embeddings", "mock", "embeddings", "chat, completions"),
    ]
    async with http_client(running.url) as http:
        for path, model, wanted, served in cases:
            response = await http.post(path, json={**VALID[path], "model": model})
            assert_api_error(
                response,
                path,
                404,
                type="not_found_error",
                anthropic_type="not_found_error",
                param="model",
                code="model_not_found",
            )
            expected = f"`{model}` does not serve {wanted} requests (it serves {served})."
            assert expected in response.text
    await assert_still_serving(running)


async def test_a_body_over_the_size_limit_is_413(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    limit = 4096
    running = await stack(frontend_env={"DYN_HTTP_MAX_BODY_SIZE": str(limit)}, memory=True)

    def completion_of_size(size: int) -> bytes:
        empty = json.dumps({"model": "mock", "prompt": "", "max_tokens": 1}).encode()
        body = json.dumps({"model": "mock", "prompt": "a" * (size - len(empty)), "max_tokens": 1})
        assert len(body) == size
        return body.encode()

    async def chunked(body: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    async with http_client(running.url) as http:
        headers = {"content-type": "application/json", "x-request-id": "too-big"}
        for path in ("/v1/completions", "/v1/messages"):
            response = await http.post(path, content=b" " * (limit + 1), headers=headers)
            assert_api_error(
                response,
                path,
                413,
                anthropic_type="request_too_large",
                code="request_too_large",
                param=None,
            )
            assert f"limit of {limit} bytes" in response.text
            assert response.headers["x-request-id"] == "too-big"
        # Without a Content-Length (chunked), the limit holds as the body arrives.
        response = await http.post(
            "/v1/completions", content=chunked(completion_of_size(limit + 1)), headers=headers
        )
        assert "content-length" not in response.request.headers
        assert_api_error(response, "/v1/completions", 413, code="request_too_large")
        # At the limit exactly, the request is served.
        response = await http.post(
            "/v1/completions", content=completion_of_size(limit), headers=headers
        )
        assert response.status_code == 200, response.text
    assert [e["id"] for e in running.worker.events if e["event"] == "start"] == ["too-big"]


async def test_a_body_that_is_not_json_is_415(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    body = json.dumps(VALID["/v1/chat/completions"]).encode()
    async with http_client(running.url) as http:
        for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/messages"):
            for content_type in (
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
            ):
                response = await http.post(
                    path, content=body, headers={"content-type": content_type}
                )
                assert_api_error(response, path, 415, code="unsupported_media_type", param=None)
                assert repr(content_type.split(";")[0]) in response.text
        # Parameters of the JSON media type are fine.
        response = await http.post(
            "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json; charset=utf-8"},
        )
        assert response.status_code == 200, response.text
    running.worker.events.clear()
    await assert_still_serving(running)


async def test_an_unknown_route_is_404_and_a_wrong_method_405(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    running = await stack(memory=True)
    async with http_client(running.url) as http:
        for method, path in (("GET", "/"), ("GET", "/v2/models"), ("POST", "/v1/chat")):
            response = await http.request(method, path)
            assert_openai_error(response, 404, "not_found_error", param=None, code=None)
            assert response.json()["error"]["message"] == f"No route {method} {path}."
        for method, path, allowed in (
            ("GET", "/v1/chat/completions", "POST"),
            ("PUT", "/v1/embeddings", "POST"),
            ("DELETE", "/v1/models", "GET"),
            ("POST", "/health", "GET"),
        ):
            response = await http.request(method, path)
            assert_openai_error(response, 405, "invalid_request_error", param=None, code=None)
            assert response.json()["error"]["message"] == (
                f"Method {method} is not allowed on {path}."
            )
            assert allowed in response.headers["allow"].split(", ")
        response = await http.get("/v1/messages")
        assert_anthropic_error(response, 405, "invalid_request_error")
        assert response.headers["allow"] == "POST"
    await assert_still_serving(running)


async def test_a_refused_request_leaves_its_keep_alive_connection_usable(
    stack: StartStack, autojump_clock: trio.testing.MockClock
) -> None:
    """A refusal answered before the body arrived must not wedge the connection.

    (The client sends its headers, then its body a moment later, as httpx does;
    the next request on the same connection must still be answered.)
    """
    running = await stack(frontend_env={"DYN_HTTP_MAX_BODY_SIZE": "4096"}, memory=True)
    body = json.dumps(VALID["/v1/chat/completions"]).encode()
    refusals = [
        ("POST /v1/chat/completions", b"Content-Type: text/plain", 415),
        ("POST /v1/chat/completions", b"x-request-id: not valid", 400),
        ("POST /v1/no/such/route", b"Content-Type: application/json", 404),
        ("PUT /v1/messages", b"Content-Type: application/json", 405),
    ]
    for request_line, header, status in refusals:
        connection = await RawConnection.open(running.url)
        async with connection.stream:
            head = f"{request_line} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            await connection.send(head.encode() + header + b"\r\n\r\n")
            await trio.sleep(0.05)
            await connection.send(body)
            refused = await connection.response()
            assert refused.status == status, refused.raw
            assert b"connection" not in refused.headers, refused.raw
            await connection.send(raw_post("/v1/chat/completions", body))
            served = await connection.response(within=3)
            assert served.status == 200, (request_line, served.raw)
    # A body over the limit is not read at all: the connection is closed, not reused.
    connection = await RawConnection.open(running.url)
    async with connection.stream:
        await connection.send(raw_post("/v1/completions", b" " * 5000))
        too_big = await connection.response()
        assert too_big.status == 413
        assert too_big.headers[b"connection"] == b"close"
