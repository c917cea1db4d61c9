"""Server-sent event encoding, decoded back with the official client's decoder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st
from openai._streaming import SSEDecoder

from dynamo_trio.llm import (
    DONE,
    encode_comment,
    encode_error_event,
    encode_event,
    keepalive_comment,
    openai_error_body,
)


def decode(raw: bytes) -> list[tuple[str | None, str]]:
    return [(e.event, e.data) for e in SSEDecoder().iter_bytes(iter([raw]))]


@pytest.mark.parametrize(
    ("data", "event", "expected"),
    [
        pytest.param(
            {"a": 1, "b": [True, None]}, None, b'data: {"a":1,"b":[true,null]}\n\n', id="json"
        ),
        pytest.param({"t": "é\n"}, None, b'data: {"t":"\xc3\xa9\\n"}\n\n', id="json-utf8"),
        pytest.param("hello", None, b"data: hello\n\n", id="str"),
        pytest.param(b"hello", None, b"data: hello\n\n", id="bytes"),
        pytest.param("", None, b"data: \n\n", id="empty"),
        pytest.param("a\nb", None, b"data: a\ndata: b\n\n", id="lf"),
        pytest.param("a\r\nb\rc", None, b"data: a\ndata: b\ndata: c\n\n", id="crlf-cr"),
        pytest.param("a\n", None, b"data: a\ndata: \n\n", id="trailing-newline"),
        pytest.param(b"x\ny", None, b"data: x\ndata: y\n\n", id="bytes-multiline"),
        pytest.param(" lead", None, b"data:  lead\n\n", id="leading-space"),
        pytest.param(
            {"type": "ping"}, "ping", b'event: ping\ndata: {"type":"ping"}\n\n', id="named"
        ),
    ],
)
def test_encode_event(
    data: str | bytes | dict[str, object], event: str | None, expected: bytes
) -> None:
    assert encode_event(data, event) == expected


def test_event_with_id() -> None:
    assert encode_event("x", "e", id="7") == b"event: e\nid: 7\ndata: x\n\n"


@pytest.mark.parametrize(
    ("event", "event_id"),
    [("a\nb", None), ("a\rb", None), (None, "1\n"), (None, "1\0")],
)
def test_fields_that_would_break_the_framing_are_refused(
    event: str | None, event_id: str | None
) -> None:
    with pytest.raises(ValueError, match="SSE"):
        encode_event("x", event, id=event_id)


def test_constants_and_comments() -> None:
    assert DONE == b"data: [DONE]\n\n"
    assert keepalive_comment() == b": keep-alive\n\n"
    assert encode_comment("a\nb") == b": a\n: b\n\n"
    assert encode_comment() == b":\n\n"


def test_comments_are_invisible_to_the_client() -> None:
    raw = keepalive_comment() + encode_comment("x\ny") + encode_event("data") + keepalive_comment()
    assert decode(raw) == [(None, "data")]


def test_error_event_format() -> None:
    raw = encode_error_event(openai_error_body(500, "boom"))
    assert raw == (
        b"event: error\n"
        b'data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}\n\n'
    )
    [(event, data)] = decode(raw)
    assert event == "error"
    assert '"message":"boom"' in data


text = st.text(st.characters(codec="utf-8"), max_size=40)
names = st.none() | st.text(
    st.characters(codec="utf-8", exclude_characters="\r\n"), min_size=1, max_size=10
)


@given(text, names)
def test_any_text_round_trips_through_the_client_decoder(data: str, event: str | None) -> None:
    normalised = data.replace("\r\n", "\n").replace("\r", "\n")
    assert decode(encode_event(data, event)) == [(event, normalised)]


@given(st.lists(st.dictionaries(st.text(max_size=5), text, max_size=3), max_size=5))
def test_a_stream_of_json_events_decodes_event_by_event(payloads: list[dict[str, str]]) -> None:
    raw = b"".join(encode_event(p) for p in payloads) + DONE
    decoded = decode(raw)
    assert [json.loads(data) for _, data in decoded[:-1]] == payloads
    assert decoded[-1] == (None, "[DONE]")
