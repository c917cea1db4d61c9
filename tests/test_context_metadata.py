"""Context's Dynamo 1.6.1 surface beside cancellation: ``metadata``, the trace fields,
``trace_headers()`` and ``detached()`` (in one process; across processes see
tests/runtime/test_propagation.py)."""

from __future__ import annotations

import pytest

from dynamo_trio import CancelReason, Context, ContextMetadata, TraceContext

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = "b7ad6b7169203331"


def test_a_context_made_by_hand_has_no_trace_as_in_dynamo() -> None:
    ctx = Context()
    assert (ctx.trace, ctx.trace_id, ctx.span_id, ctx.parent_span_id) == (None,) * 4
    assert ctx.trace_headers() is None
    assert len(ctx.metadata) == 0


def test_trace_fields_read_the_trace() -> None:
    trace = TraceContext(TRACE, SPAN, PARENT, tracestate="a=b", x_request_id="client-7")
    ctx = Context("req-1", trace=trace)
    assert ctx.trace is trace
    assert (ctx.trace_id, ctx.span_id, ctx.parent_span_id) == (TRACE, SPAN, PARENT)
    assert ctx.trace_headers() == {
        "traceparent": f"00-{TRACE}-{SPAN}-01",
        "tracestate": "a=b",
        "x-request-id": "client-7",
        "request-id": "req-1",
    }


def test_metadata_is_a_live_string_map() -> None:
    ctx = Context("r", {"tenant": "acme"})
    view = ctx.metadata
    assert isinstance(view, ContextMetadata)
    assert view["tenant"] == "acme" and "tenant" in view and len(view) == 1
    view["lora"] = "adapter-1"
    assert ctx.metadata.get("lora") == "adapter-1"  # a new view sees the write
    assert ctx.metadata.get("missing") is None
    assert ctx.metadata.get("missing", "d") == "d"
    assert sorted(view) == ["lora", "tenant"]
    assert view.keys() == ["tenant", "lora"]
    assert view.values() == ["acme", "adapter-1"]
    assert view.items() == [("tenant", "acme"), ("lora", "adapter-1")]
    copy = view.copy()
    assert copy == {"tenant": "acme", "lora": "adapter-1"} and type(copy) is dict
    copy["x"] = "y"
    assert "x" not in view  # a copy is a snapshot
    assert view == {"tenant": "acme", "lora": "adapter-1"} and view == ctx.metadata
    del view["lora"]
    assert view.pop("tenant") == "acme"
    assert view.pop("tenant", None) is None  # a default (even None) instead of KeyError
    with pytest.raises(KeyError):
        view.pop("tenant")
    with pytest.raises(KeyError):
        view["tenant"]
    with pytest.raises(KeyError):
        del view["tenant"]
    view.update({"a": "1"})
    view.clear()
    assert len(ctx.metadata) == 0
    assert repr(view) == "{}"


def test_assigning_metadata_replaces_it_in_every_view() -> None:
    ctx = Context(metadata={"old": "1"})
    view = ctx.metadata
    ctx.metadata = {"new": "2"}
    assert view.copy() == {"new": "2"}


@pytest.mark.parametrize("bad", [{"k": 1}, {1: "v"}, {"k": None}])
def test_metadata_holds_strings_only(bad: dict[object, object]) -> None:
    with pytest.raises(TypeError, match="str"):
        Context(metadata=bad)  # type: ignore[arg-type]
    ctx = Context()
    with pytest.raises(TypeError, match="str"):
        ctx.metadata = bad  # type: ignore[assignment]
    [(key, value)] = bad.items()
    with pytest.raises(TypeError, match="str"):
        ctx.metadata[key] = value  # type: ignore[index, assignment]
    assert len(ctx.metadata) == 0


def test_iterating_while_writing_is_safe() -> None:
    ctx = Context(metadata={"a": "1", "b": "2"})
    for key in ctx.metadata:  # iterates a snapshot of the keys, as Dynamo's does
        ctx.metadata[key + "x"] = "3"
    assert len(ctx.metadata) == 4


def test_the_metadata_given_is_copied() -> None:
    given = {"k": "v"}
    ctx = Context(metadata=given)
    given["k"] = "changed"
    assert ctx.metadata["k"] == "v"


def test_detached_keeps_trace_and_a_metadata_snapshot_but_not_cancellation() -> None:
    trace = TraceContext(TRACE, SPAN)
    parent = Context("r", {"k": "v"}, trace=trace)
    detached = parent.detached("other")
    assert detached.id() == "other" and detached.trace is trace
    assert detached.metadata.copy() == {"k": "v"}
    detached.metadata["k"] = "changed"
    assert parent.metadata["k"] == "v"
    parent.kill()
    assert not detached.is_stopped() and detached.parent is None
    detached.stop()
    assert parent.reason is CancelReason.KILL_REQUESTED
    assert detached.reason is CancelReason.STOP_REQUESTED and not detached.is_killed()


def test_metadata_and_trace_do_not_touch_cancellation() -> None:
    parent = Context("r", {"k": "v"}, trace=TraceContext(TRACE, SPAN))
    child = Context("r")
    parent.link_child(child)
    parent.metadata["other"] = "x"
    parent.stop()
    assert child.is_stopped() and not child.is_killed()
    assert child.trace is None and len(child.metadata) == 0  # linking shares neither


def test_the_snapshot_shows_the_trace_id() -> None:
    ctx = Context("r", trace=TraceContext(TRACE, SPAN))
    assert ctx.snapshot()["trace_id"] == TRACE
    assert Context().snapshot()["trace_id"] is None
