"""Trace context and request ids, sans I/O: W3C ``traceparent`` rules, the request-id choice,
and what a call's ``req`` frame carries (strings in, strings out)."""

from __future__ import annotations

import re
import string
import uuid

import hypothesis.strategies as st
import pytest
from hypothesis import given

from dynamo_trio import InvalidArgument, InvalidRequestId, TraceContext
from dynamo_trio._tracing import (
    MAX_HEADER_NAME_LENGTH,
    MAX_HEADER_VALUE_LENGTH,
    MAX_HEADERS,
    MAX_METADATA_ENTRIES,
    MAX_METADATA_KEY_LENGTH,
    MAX_METADATA_VALUE_LENGTH,
    METADATA_PREFIX,
    ParsedTraceParent,
    RequestIds,
    check_metadata,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    read_request_headers,
    request_headers,
    request_ids,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"
HEX = re.compile(r"[0-9a-f]+")

# ---------------------------------------------------------------------------- traceparent


def test_a_valid_traceparent_is_parsed() -> None:
    assert parse_traceparent(VALID) == ParsedTraceParent(0, TRACE, PARENT, 1)
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-00") == ParsedTraceParent(0, TRACE, PARENT, 0)
    # Optional whitespace around a header value is not part of it.
    assert parse_traceparent(f" \t{VALID} ") == ParsedTraceParent(0, TRACE, PARENT, 1)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "00",
        VALID.upper(),  # W3C: lowercase hex only
        f"00-{TRACE.upper()}-{PARENT}-01",
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE}-{PARENT}-01x",
        f"01-{TRACE}-{PARENT}-01x",  # a later version extends only after a '-'
        f"00-{TRACE[:-1]}-{PARENT}-01",
        f"00-{TRACE}-{PARENT[:-1]}-01",
        f"00-{TRACE}-{PARENT}-1",
        f"0-{TRACE}-{PARENT}-01",
        f"00_{TRACE}_{PARENT}_01",
        f"00-{TRACE}-{PARENT}",
        f"00-{TRACE}g-{PARENT}-01"[:55],
    ],
)
def test_an_invalid_traceparent_is_none(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_may_carry_more_fields() -> None:
    assert parse_traceparent(f"cc-{TRACE}-{PARENT}-01-what-the-future-holds") == (
        ParsedTraceParent(0xCC, TRACE, PARENT, 1)
    )


@given(st.text(max_size=120))
def test_parsing_any_text_never_fails(value: str) -> None:
    parsed = parse_traceparent(value)
    if parsed is not None:
        assert HEX.fullmatch(parsed.trace_id) and len(parsed.trace_id) == 32
        assert HEX.fullmatch(parsed.parent_id) and len(parsed.parent_id) == 16
        assert parsed.trace_id != "0" * 32 and parsed.parent_id != "0" * 16
        assert 0 <= parsed.flags <= 255 and 0 <= parsed.version < 255


@given(
    st.text("0123456789abcdef", min_size=32, max_size=32),
    st.text("0123456789abcdef", min_size=16, max_size=16),
    st.integers(0, 255),
)
def test_traceparents_round_trip(trace_id: str, span_id: str, flags: int) -> None:
    context = TraceContext(trace_id, span_id, flags=flags)
    parsed = parse_traceparent(context.traceparent())
    if trace_id == "0" * 32 or span_id == "0" * 16:
        assert parsed is None
    else:
        assert parsed == ParsedTraceParent(0, trace_id, span_id, flags)


def test_new_ids_are_w3c_ids() -> None:
    traces = {new_trace_id() for _ in range(200)}
    spans = {new_span_id() for _ in range(200)}
    assert len(traces) == 200 and len(spans) == 200
    assert all(HEX.fullmatch(t) and len(t) == 32 for t in traces)
    assert all(HEX.fullmatch(s) and len(s) == 16 for s in spans)


def test_continuing_a_trace_opens_a_span_under_the_callers() -> None:
    trace = TraceContext.continued(VALID, "congo=t61rcWkgMzE", x_request_id="abc")
    assert (trace.trace_id, trace.parent_span_id) == (TRACE, PARENT)
    assert trace.span_id not in (PARENT, "0" * 16) and len(trace.span_id) == 16
    assert trace.sampled and trace.flags == 1
    assert trace.tracestate == "congo=t61rcWkgMzE"
    assert trace.traceparent() == f"00-{TRACE}-{trace.span_id}-01"
    assert trace.headers() == {
        "traceparent": trace.traceparent(),
        "tracestate": "congo=t61rcWkgMzE",
        "x-request-id": "abc",
    }
    # The next hop's span is a child of this one.
    child = TraceContext.continued(trace.traceparent(), trace.tracestate)
    assert (child.trace_id, child.parent_span_id) == (TRACE, trace.span_id)


def test_an_unsampled_trace_stays_unsampled() -> None:
    trace = TraceContext.continued(f"00-{TRACE}-{PARENT}-00")
    assert not trace.sampled
    assert trace.traceparent().endswith("-00")


@pytest.mark.parametrize("traceparent", [None, "garbage", VALID.upper()])
def test_no_valid_traceparent_starts_a_new_trace_and_drops_tracestate(
    traceparent: str | None,
) -> None:
    trace = TraceContext.continued(traceparent, "congo=t61rcWkgMzE")
    assert trace.trace_id != TRACE and len(trace.trace_id) == 32
    assert trace.parent_span_id is None
    assert trace.tracestate is None
    assert trace.sampled  # new traces are sampled, as Dynamo starts them
    assert trace.headers() == {"traceparent": trace.traceparent()}


@pytest.mark.parametrize("tracestate", ["", "  ", "x" * 513, "a=b\nc=d", "caf\u00e9=1"])
def test_an_unusable_tracestate_is_dropped(tracestate: str) -> None:
    assert TraceContext.continued(VALID, tracestate).tracestate is None


def test_a_tracestate_up_to_512_characters_is_kept() -> None:
    state = "k=" + "v" * 510
    assert TraceContext.continued(VALID, f" {state} ").tracestate == state


# ---------------------------------------------------------------------------- request ids


def test_without_headers_the_id_is_a_fresh_uuid4() -> None:
    first, second = request_ids(None, None), request_ids(None, None)
    assert first.source == "generated" and first.x_request_id is None
    assert uuid.UUID(first.request_id).version == 4
    assert first.request_id != second.request_id
    assert first.response_headers() == [
        ("x-request-id", first.request_id),
        ("x-dynamo-request-id", first.request_id),
    ]


def test_x_request_id_alone_is_the_id() -> None:
    ids = request_ids("req-1", None)
    assert ids == RequestIds("req-1", "req-1", "x-request-id")
    assert ids.response_headers() == [("x-request-id", "req-1"), ("x-dynamo-request-id", "req-1")]


def test_x_dynamo_request_id_alone_is_the_id() -> None:
    given_id = str(uuid.uuid4())
    ids = request_ids(None, given_id)
    assert ids == RequestIds(given_id, None, "x-dynamo-request-id")
    assert ids.response_headers() == [
        ("x-request-id", given_id),
        ("x-dynamo-request-id", given_id),
    ]


def test_with_both_the_dynamo_header_wins_and_x_request_id_travels_along() -> None:
    ids = request_ids("from-the-proxy", "from-the-client")
    assert ids == RequestIds("from-the-client", "from-the-proxy", "x-dynamo-request-id")
    # A proxy correlating on x-request-id gets its own value back.
    assert ids.response_headers() == [
        ("x-request-id", "from-the-proxy"),
        ("x-dynamo-request-id", "from-the-client"),
    ]


def test_a_non_uuid_dynamo_id_is_honoured() -> None:
    # Dynamo 1.6.1 drops a non-UUID x-dynamo-request-id; any valid id is used here.
    assert request_ids(None, "job-17/step-3").request_id == "job-17/step-3"


@pytest.mark.parametrize("header", ["x-request-id", "x-dynamo-request-id"])
@pytest.mark.parametrize(
    "value", ["", "x" * 257, "has space", "tab\t", "nl\n", "\x7f", "caf\u00e9"]
)
def test_an_invalid_id_in_either_header_is_refused_naming_it(header: str, value: str) -> None:
    plain, dynamo = (value, "ok") if header == "x-request-id" else ("ok", value)
    with pytest.raises(InvalidRequestId) as caught:
        request_ids(plain, dynamo)
    assert caught.value.header == header
    assert header in caught.value.message
    assert isinstance(caught.value, InvalidArgument)


@given(st.text(string.printable + "\u00e9\x00\x7f", max_size=300))
def test_an_id_is_used_as_given_or_refused(value: str) -> None:
    valid = 1 <= len(value) <= 256 and all("\x21" <= c <= "\x7e" for c in value)
    try:
        ids = request_ids(value, None)
    except InvalidRequestId:
        assert not valid
    else:
        assert valid and ids.request_id == value


# ---------------------------------------------------------------------------- request plane


def test_a_call_carries_its_trace_and_metadata() -> None:
    trace = TraceContext(TRACE, PARENT, tracestate="a=b", x_request_id="r")
    headers = request_headers(trace, {"tenant": "acme", "lora": "x"})
    assert headers == {
        "traceparent": f"00-{TRACE}-{PARENT}-01",
        "tracestate": "a=b",
        "x-request-id": "r",
        f"{METADATA_PREFIX}tenant": "acme",
        f"{METADATA_PREFIX}lora": "x",
    }
    worker_trace, metadata = read_request_headers(headers)
    assert metadata == {"tenant": "acme", "lora": "x"}
    assert (worker_trace.trace_id, worker_trace.parent_span_id) == (TRACE, PARENT)
    assert worker_trace.span_id != PARENT
    assert (worker_trace.tracestate, worker_trace.x_request_id) == ("a=b", "r")


def test_a_call_without_trace_or_metadata_sends_no_headers() -> None:
    assert request_headers(None, {}) is None
    assert request_headers(None, {"k": "v"}) == {f"{METADATA_PREFIX}k": "v"}
    trace, metadata = read_request_headers({})
    assert trace.parent_span_id is None and len(trace.trace_id) == 32
    assert metadata == {}


def test_unknown_headers_are_ignored() -> None:
    trace, metadata = read_request_headers({"something-new": "1", "traceparent": "junk"})
    assert metadata == {} and trace.parent_span_id is None


def test_the_largest_metadata_allowed_fits_the_request_planes_limits() -> None:
    metadata = {
        f"{i:03d}".ljust(MAX_METADATA_KEY_LENGTH, "k"): "v" * MAX_METADATA_VALUE_LENGTH
        for i in range(MAX_METADATA_ENTRIES)
    }
    check_metadata(metadata)
    trace = TraceContext(TRACE, PARENT, tracestate="s" * 512, x_request_id="r" * 256)
    headers = request_headers(trace, metadata)
    assert headers is not None and len(headers) == MAX_HEADERS
    assert all(1 <= len(name) <= MAX_HEADER_NAME_LENGTH for name in headers)
    assert all(len(value) <= MAX_HEADER_VALUE_LENGTH for value in headers.values())


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({str(i): "" for i in range(MAX_METADATA_ENTRIES + 1)}, "entries"),
        ({"k" * (MAX_METADATA_KEY_LENGTH + 1): ""}, "keys"),
        ({"k": "v" * (MAX_METADATA_VALUE_LENGTH + 1)}, "metadata"),
        ({"k": 1}, "string"),
        ({1: "v"}, "keys"),
    ],
)
def test_metadata_that_cannot_travel_is_refused(
    metadata: dict[object, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        check_metadata(metadata)


@given(
    st.dictionaries(
        st.one_of(
            st.sampled_from(["traceparent", "tracestate", "x-request-id", "meta:", "meta:k"]),
            st.text(min_size=1, max_size=20),
        ),
        st.one_of(st.just(VALID), st.text(max_size=80)),
        max_size=70,
    )
)
def test_a_peers_headers_never_break_the_worker_side(headers: dict[str, str]) -> None:
    trace, metadata = read_request_headers(headers)
    assert HEX.fullmatch(trace.trace_id) and len(trace.trace_id) == 32
    assert HEX.fullmatch(trace.span_id) and len(trace.span_id) == 16
    assert trace.parent_span_id is None or len(trace.parent_span_id) == 16
    assert metadata == {
        name.removeprefix(METADATA_PREFIX): value
        for name, value in headers.items()
        if name.startswith(METADATA_PREFIX)
    }
    # What a worker passes on is always a valid traceparent.
    assert parse_traceparent(trace.traceparent()) is not None
