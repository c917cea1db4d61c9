"""The embeddings API: parsing, the response shape, base64, and the official client."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx2
import msgspec
import pytest
from hypothesis import given, strategies as st
from openai.types import CreateEmbeddingResponse

from dynamo_trio.llm import (
    EngineError,
    RequestError,
    embedding_response,
    encode_base64_floats,
    parse_embedding_request,
)

from ._support import openai_client


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "e", "input": "hello", **fields}


BAD = [
    pytest.param({"model": "e"}, "input", "Missing required parameter", id="no-input"),
    pytest.param({"input": "x"}, "model", "Missing required parameter", id="no-model"),
    pytest.param(body(input=5), "input", "a string or an array of strings", id="input-int"),
    pytest.param(body(input=""), "input", "non-empty", id="input-empty-str"),
    pytest.param(body(input=[]), "input", "at least one input", id="input-empty"),
    pytest.param(body(input=["a", ""]), "input[1]", "non-empty", id="item-empty"),
    pytest.param(body(input=["a", None]), "input[1]", "but got null", id="item-null"),
    pytest.param(body(input=["a", {}]), "input[1]", "but got an object", id="item-object"),
    pytest.param(body(input=[1, 2]), "input", "token-id inputs", id="token-ids"),
    pytest.param(body(input=[[1, 2]]), "input", "token-id inputs", id="token-batch"),
    pytest.param(body(input=["x"] * 2049), "input", "at most 2048 inputs", id="too-many"),
    pytest.param(body(encoding_format="hex"), "encoding_format", "'hex'", id="format"),
    pytest.param(body(encoding_format=1), "encoding_format", "a string", id="format-int"),
    pytest.param(body(dimensions=0), "dimensions", ">= 1", id="dimensions-0"),
    pytest.param(body(dimensions="8"), "dimensions", "an integer", id="dimensions-str"),
]


@pytest.mark.parametrize(("request_body", "param", "fragment"), BAD)
def test_bad_embedding_request_is_a_400_naming_the_parameter(
    request_body: object, param: str, fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_embedding_request(request_body)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert fragment in caught.value.message
    assert f"'{param}'" in caught.value.message


def test_embedding_request_to_engine() -> None:
    request = parse_embedding_request(body(input=["a", "b"], dimensions=8, user="u", extra=1))
    assert request.encoding_format == "float"
    assert request.to_engine() == {
        "model": "e",
        "request_type": "embedding",
        "input": ["a", "b"],
        "dimensions": 8,
    }
    assert parse_embedding_request(body()).inputs == ("hello",)


OUTPUT = {"embeddings": [[0.5, -0.25], [1.0, 0.0]], "usage": {"prompt_tokens": 3}}


def test_float_response_validates_as_the_clients_type() -> None:
    request = parse_embedding_request(body(input=["a", "b"]))
    response = embedding_response(request, OUTPUT)
    assert response == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, -0.25]},
            {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]},
        ],
        "model": "e",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    CreateEmbeddingResponse.model_validate(response)


def test_base64_is_little_endian_float32() -> None:
    assert (
        encode_base64_floats([1.0, -2.5])
        == base64.b64encode(b"\x00\x00\x80\x3f\x00\x00\x20\xc0").decode()
    )
    request = parse_embedding_request(body(input=["a", "b"], encoding_format="base64"))
    response = embedding_response(request, OUTPUT)
    data = response["data"]
    assert isinstance(data, list)
    assert data[0]["embedding"] == encode_base64_floats([0.5, -0.25])


@given(st.lists(st.floats(width=32, allow_nan=False), max_size=64))
def test_base64_round_trips_float32(vector: list[float]) -> None:
    raw = base64.b64decode(encode_base64_floats(vector))
    assert list(struct.unpack(f"<{len(vector)}f", raw)) == vector


@pytest.mark.parametrize(
    "output",
    [
        pytest.param({"embeddings": [[1.0]], "usage": {"prompt_tokens": 1}}, id="one-vector"),
        pytest.param({"embeddings": [[1.0], ["x"]], "usage": {"prompt_tokens": 1}}, id="str"),
        pytest.param({"embeddings": [[1.0], [2.0]]}, id="no-usage"),
        pytest.param("nope", id="not-an-object"),
    ],
)
def test_malformed_engine_output_is_an_engine_error(output: object) -> None:
    request = parse_embedding_request(body(input=["a", "b"]))
    with pytest.raises(EngineError, match="malformed embedding output"):
        embedding_response(request, output)


def _serve(seen: list[dict[str, Any]]) -> Any:
    def handler(http_request: httpx2.Request) -> httpx2.Response:
        request_body = msgspec.json.decode(http_request.content)
        seen.append(request_body)
        request = parse_embedding_request(request_body)
        return httpx2.Response(200, json=embedding_response(request, OUTPUT))

    return handler


def test_official_client_reads_float_vectors_strictly() -> None:
    seen: list[dict[str, Any]] = []
    result = openai_client(_serve(seen)).embeddings.create(
        model="e", input=["a", "b"], encoding_format="float"
    )
    assert [d.embedding for d in result.data] == [[0.5, -0.25], [1.0, 0.0]]
    assert result.usage.prompt_tokens == 3
    assert seen[0]["encoding_format"] == "float"


def test_official_client_decodes_base64_by_default() -> None:
    # Without encoding_format the client asks for base64 and decodes it itself
    # (after parsing, so strict validation of the raw body is not possible).
    seen: list[dict[str, Any]] = []
    result = openai_client(_serve(seen), strict=False).embeddings.create(
        model="e", input=["a", "b"]
    )
    assert seen[0]["encoding_format"] == "base64"
    assert [list(d.embedding) for d in result.data] == [[0.5, -0.25], [1.0, 0.0]]
