"""Request frames are validated field by field: a bad field fails that stream only.

Issue 12: ``timeout=NaN`` in a request frame became an ``Unknown`` error deep
in the runtime, and a non-string header value made the whole frame
undecodable (a protocol error for the whole connection).  Now each is a
precise ``err InvalidArgument`` for that stream, and the connection goes on.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from dynamo_trio import InvalidArgument, ProtocolError
from dynamo_trio._tracing import MAX_HEADER_VALUE_LENGTH, MAX_HEADERS
from dynamo_trio.request_plane._frames import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Error,
    FrameDecoder,
    Hello,
    RawRequest,
    Request,
    encode_frame,
)
from dynamo_trio.request_plane._protocol import ConnectionState, ProtocolConnection, Role
from dynamo_trio.request_plane._validate import (
    MAX_NAME_LENGTH,
    MAX_WINDOW,
    json_problem,
    validate_request,
)
from tests._fuzz import examples

LIMIT = 1 << 20


def raw(**fields):
    base = {
        "sid": 1,
        "endpoint": "dynamo/backend/generate",
        "instance_id": 7,
        "request_id": "req-1",
        "payload": {"prompt": "hi"},
        "window": 8,
        "timeout": None,
        "headers": None,
    }
    base.update(fields)
    return RawRequest(**base)  # type: ignore[arg-type]  # (the fields are any values on purpose)


def open_server():
    server = ProtocolConnection(Role.SERVER, max_frame_size=LIMIT)
    server.receive_data(_wire_bytes([["hello", PROTOCOL_VERSION, b"n" * NONCE_SIZE, "c"]]))
    out = bytearray()
    encode_frame(Auth(None), out, LIMIT)
    server.receive_data(out)
    assert server.authenticate()
    server.data_to_send()
    return server


def _wire_bytes(bodies):
    out = bytearray()
    for body in bodies:
        encoded = msgspec.msgpack.encode(body)
        out += len(encoded).to_bytes(4, "big") + encoded
    return bytes(out)


def request_body(sid, **fields):
    """A ``req`` frame's msgpack array with any values at all in its fields."""
    frame = raw(sid=sid, **fields)
    return ["req", *msgspec.structs.astuple(frame)]


# ----------------------------------------------------------------- one field at a time

INVALID = [
    ("timeout", math.nan, "`timeout`"),
    ("timeout", math.inf, "`timeout`"),
    ("timeout", -math.inf, "`timeout`"),
    ("timeout", -0.001, "`timeout`"),
    ("timeout", "5", "`timeout`"),
    ("timeout", True, "`timeout`"),
    ("timeout", [1], "`timeout`"),
    ("window", 0, "`window`"),
    ("window", -1, "`window`"),
    ("window", MAX_WINDOW + 1, "`window`"),
    ("window", 2**64 - 1, "`window`"),
    ("window", 1.5, "`window`"),
    ("window", "8", "`window`"),
    ("endpoint", "", "`endpoint`"),
    ("endpoint", 5, "`endpoint`"),
    ("endpoint", "e" * (MAX_NAME_LENGTH + 1), "`endpoint`"),
    ("request_id", None, "`request_id`"),
    ("request_id", "", "`request_id`"),
    ("request_id", b"bytes", "`request_id`"),
    ("instance_id", -1, "`instance_id`"),
    ("instance_id", "7", "`instance_id`"),
    ("instance_id", False, "`instance_id`"),
    ("headers", "a=b", "`headers`"),
    ("headers", ["a", "b"], "`headers`"),
    ("headers", {"a": 1}, "`headers['a']`"),
    ("headers", {"a": None}, "`headers['a']`"),
    ("headers", {"a": ["b"]}, "`headers['a']`"),
    ("headers", {1: "b"}, "`headers`"),
    ("headers", {"": "b"}, "`headers`"),
    ("headers", {"a": "v" * (MAX_HEADER_VALUE_LENGTH + 1)}, "`headers['a']`"),
    ("headers", {f"h{i}": "v" for i in range(MAX_HEADERS + 1)}, "`headers` has"),
    ("payload", b"bytes", "`payload`"),
    ("payload", {"a": [1, b"x"]}, "payload['a'][1] is a bytes"),
    ("payload", {1: "int key"}, "map key"),
    ("payload", msgspec.msgpack.Ext(5, b"x"), "`payload`"),
    ("payload", datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC), "`payload`"),
]


@pytest.mark.parametrize(
    ("field", "value", "words"), INVALID, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(INVALID)]
)
def test_validate_request_names_the_bad_field(field, value, words):
    with pytest.raises(InvalidArgument, match="invalid request frame") as info:
        validate_request(raw(**{field: value}))
    assert words in info.value.message


@pytest.mark.parametrize(
    ("field", "value", "words"), INVALID, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(INVALID)]
)
def test_a_bad_field_on_the_wire_fails_that_stream_and_the_connection_goes_on(field, value, words):
    server = open_server()
    data = _wire_bytes([request_body(1, **{field: value}), request_body(2)])
    (opened,) = server.receive_data(data)
    assert opened.sid == 2
    (refusal,) = FrameDecoder(LIMIT).feed(server.data_to_send())
    assert isinstance(refusal, Error)
    assert (refusal.sid, refusal.code) == (1, "InvalidArgument")
    assert words in refusal.message
    assert server.state is ConnectionState.OPEN
    assert not server.is_open(1) and server.is_open(2)
    assert server.refused_streams == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout", 0),
        ("timeout", 0.0),
        ("timeout", 12),
        ("timeout", 1e300),
        ("window", 1),
        ("window", MAX_WINDOW),
        ("instance_id", 2**64 - 1),
        ("headers", {}),
        ("headers", {"traceparent": "00-abc-def-01"}),
        ("headers", {f"h{i}": "v" for i in range(MAX_HEADERS)}),
        ("payload", None),
        ("payload", [1, 2.5, "x", True, None, {"deep": [[[{}]]]}]),
        ("payload", {"nan": math.nan}),
    ],
)
def test_values_at_the_edges_are_accepted(field, value):
    request = validate_request(raw(**{field: value}))
    assert isinstance(request, Request)
    if field == "timeout":
        assert request.timeout == float(value) and type(request.timeout) is float


def test_a_request_with_a_bad_sid_is_a_protocol_error():
    """Without a stream id there is no stream to answer: the connection is at fault."""
    server = open_server()
    with pytest.raises(ProtocolError, match=r"\$\[1\]"):
        server.receive_data(_wire_bytes([["req", "1", "e", 1, "r", None, 1]]))


def test_json_problem_is_iterative_and_names_the_path():
    value = {"a": [0, 1, {"b": ["ok", {"c": b"x"}]}]}
    assert json_problem(value) == "must be JSON-like: payload['a'][2]['b'][1]['c'] is a bytes"
    deep: Any = None
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    assert json_problem(deep) is None
    assert json_problem([deep, {1.5: None}]) is not None


@settings(max_examples=examples(300), deadline=None)
@given(
    values=st.lists(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)
        | st.floats()
        | st.text(max_size=8)
        | st.binary(max_size=8)
        | st.lists(st.integers(0, 3), max_size=3)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 3), st.text(max_size=3) | st.none()),
        min_size=7,
        max_size=7,
    )
)
def test_any_field_values_open_the_stream_or_fail_it_never_anything_else(values):
    server = open_server()
    fields = ("endpoint", "instance_id", "request_id", "payload", "window", "timeout", "headers")
    body = request_body(1, **dict(zip(fields, values, strict=True)))
    returned = server.receive_data(_wire_bytes([body]))
    queued = FrameDecoder(LIMIT).feed(server.data_to_send())
    if returned:
        (request,) = returned
        assert isinstance(request, Request) and queued == []
        assert request.timeout is None or (math.isfinite(request.timeout) and request.timeout >= 0)
        assert 1 <= request.window <= MAX_WINDOW
    else:
        (refusal,) = queued
        assert isinstance(refusal, Error)
        assert (refusal.sid, refusal.code) == (1, "InvalidArgument")
    assert server.state is ConnectionState.OPEN


def test_hello_helper_is_a_real_hello():
    """Guard for this module's raw-bytes helper."""
    (frame,) = FrameDecoder(LIMIT).feed(
        _wire_bytes([["hello", PROTOCOL_VERSION, b"n" * NONCE_SIZE, "c"]])
    )
    assert frame == Hello(PROTOCOL_VERSION, b"n" * NONCE_SIZE, "c")


def test_a_configured_window_is_one_every_worker_accepts():
    from dynamo_trio import Config

    assert Config.from_env({"DYN_STREAM_WINDOW": str(MAX_WINDOW)}).request_plane.stream_window
    with pytest.raises(ValueError, match="DYN_STREAM_WINDOW"):
        Config.from_env({"DYN_STREAM_WINDOW": str(MAX_WINDOW + 1)})
