"""Metadata and W3C trace context travel with each call, and a worker's log lines name the
request and its trace (two runtimes, real TCP; across processes see tests/e2e/test_porting.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
import trio

from dynamo_trio import Context, InvalidArgument, RequestLogFilter, TraceContext
from dynamo_trio._logcontext import LOG_FORMAT
from dynamo_trio._tracing import MAX_METADATA_ENTRIES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from dynamo_trio.runtime import Client

    from .conftest import Cluster

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def seen_by(context: Context) -> dict[str, Any]:
    return {
        "id": context.id(),
        "trace_id": context.trace_id,
        "span_id": context.span_id,
        "parent_span_id": context.parent_span_id,
        "metadata": context.metadata.copy(),
        "trace_headers": context.trace_headers(),
    }


async def reporting(request: Any, context: Context) -> AsyncIterator[Any]:
    seen = seen_by(context)
    context.metadata["added-by-the-worker"] = "1"  # never travels back
    yield seen


async def first(client: Client, request: Any = None, **kwargs: Any) -> Any:
    async with await client.generate(request, **kwargs) as stream:
        async for item in stream:
            return item.data()
    raise AssertionError("no item")


async def test_metadata_set_by_the_caller_arrives_at_the_handler(cluster: Cluster) -> None:
    client = await cluster.serve(reporting)
    ctx = Context("req-1", {"tenant": "acme", "priority": "high"})
    seen = await first(client, context=ctx)
    assert seen["id"] == "req-1"
    assert seen["metadata"] == {"tenant": "acme", "priority": "high"}
    assert ctx.metadata.copy() == {"tenant": "acme", "priority": "high"}
    # Metadata set later travels with later calls.
    ctx.metadata["priority"] = "low"
    assert (await first(client, context=Context(metadata=ctx.metadata.copy())))["metadata"] == {
        "tenant": "acme",
        "priority": "low",
    }


async def test_the_callers_trace_continues_on_the_worker_in_a_span_of_its_own(
    cluster: Cluster,
) -> None:
    client = await cluster.serve(reporting)
    ctx = Context("req-2", trace=TraceContext(TRACE, CALLER_SPAN, tracestate="a=b"))
    seen = await first(client, context=ctx)
    assert seen["trace_id"] == TRACE
    assert seen["parent_span_id"] == CALLER_SPAN
    assert seen["span_id"] not in (None, CALLER_SPAN)
    assert seen["trace_headers"] == {
        "traceparent": f"00-{TRACE}-{seen['span_id']}-01",
        "tracestate": "a=b",
        "request-id": "req-2",
    }


@pytest.mark.parametrize("context", [None, "by hand"])
async def test_a_call_without_a_trace_starts_one_on_the_worker(
    cluster: Cluster, context: str | None
) -> None:
    client = await cluster.serve(reporting)
    seen = await first(client, context=Context() if context else None)
    assert len(seen["trace_id"]) == 32 and len(seen["span_id"]) == 16
    assert seen["parent_span_id"] is None
    again = await first(client)
    assert again["trace_id"] != seen["trace_id"]


async def test_trace_and_metadata_follow_a_chain_of_hops(cluster: Cluster) -> None:
    """caller -> middle (forwards its context, adds metadata) -> backend, and a second
    backend call from the middle made with no context at all (the implicit current trace)."""
    backend = await cluster.serve(reporting, "dynamo/backend/generate")

    async def middle(request: Any, context: Context) -> AsyncIterator[Any]:
        context.metadata["hop"] = "middle"
        forwarded = await first(backend, context=context)
        implicit = await first(backend)
        yield {"middle": seen_by(context), "forwarded": forwarded, "implicit": implicit}

    middle_client = await cluster.serve(middle, "dynamo/middle/generate")
    ctx = Context("req-3", {"tenant": "acme"}, trace=TraceContext(TRACE, CALLER_SPAN))
    seen = await first(middle_client, context=ctx)
    at_middle, forwarded, implicit = seen["middle"], seen["forwarded"], seen["implicit"]

    assert at_middle["trace_id"] == TRACE and at_middle["parent_span_id"] == CALLER_SPAN
    assert forwarded["id"] == "req-3"
    assert forwarded["trace_id"] == TRACE
    assert forwarded["parent_span_id"] == at_middle["span_id"]
    assert forwarded["metadata"] == {"tenant": "acme", "hop": "middle"}
    # Without a context the call is a new request, still in the middle's trace.
    assert implicit["id"] != "req-3" and implicit["metadata"] == {}
    assert implicit["trace_id"] == TRACE
    assert implicit["parent_span_id"] == at_middle["span_id"]
    spans = {CALLER_SPAN, at_middle["span_id"], forwarded["span_id"], implicit["span_id"]}
    assert len(spans) == 4
    assert ctx.metadata.copy() == {"tenant": "acme"}  # nothing travels back


async def test_metadata_that_cannot_travel_is_refused_before_anything_is_sent(
    cluster: Cluster,
) -> None:
    calls: list[Any] = []

    async def handler(request: Any) -> AsyncIterator[Any]:
        calls.append(request)
        yield request

    client = await cluster.serve(handler)
    ctx = Context(metadata={str(i): "v" for i in range(MAX_METADATA_ENTRIES + 1)})
    with pytest.raises(InvalidArgument, match="entries"):
        await client.generate("x", context=ctx)
    ctx = Context(metadata={"k": "v" * 9000})
    with pytest.raises(InvalidArgument, match="metadata"):
        await client.direct("x", cluster.worker.instance_id, context=ctx)
    assert calls == [] and ctx.children == ()
    assert [i.data() async for i in await client.generate("ok")] == ["ok"]


# ---------------------------------------------------------------------------- log lines


class Lines(logging.Handler):
    """Formats records the way @dynamo_worker() does, filter included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(RequestLogFilter())
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def test_a_workers_log_lines_for_a_request_name_it_and_its_trace(
    cluster: Cluster, lines: Lines
) -> None:
    log = logging.getLogger("tests.handler")

    async def logged_task(context: Context) -> None:
        log.info("from a task the handler started")

    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        log.info("handling %s", request)
        context.start_soon(logged_task, context)
        await trio.sleep(0.01)
        if request == "fail":
            raise ValueError("bad request")
        yield "ok"

    client = await cluster.serve(handler)
    log.info("outside any request")
    ctx = Context("req-log", trace=TraceContext(TRACE, CALLER_SPAN))
    assert [i.data() async for i in await client.generate("hello", context=ctx)] == ["ok"]
    with pytest.raises(InvalidArgument):
        async for _ in await client.generate("fail", context=Context("req-fail")):
            pass

    tag = f"[request_id=req-log trace_id={TRACE}]"
    assert any(line.endswith(f"tests.handler {tag}: handling hello") for line in lines.lines)
    assert any(f"tests.handler {tag}: from a task the handler started" in x for x in lines.lines)
    assert any(line.endswith("tests.handler: outside any request") for line in lines.lines)
    # The runtime's own line about a request names it too (its trace is the worker's own).
    [failed] = [line for line in lines.lines if "failed: InvalidArgument" in line]
    assert "[request_id=req-fail trace_id=" in failed
    # Nothing the test process logged outside a handler is tagged.
    assert not any("request_id=" in line for line in lines.lines if "outside" in line)


def test_the_filter_escapes_peer_chosen_ids_and_keeps_given_fields() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    RequestLogFilter().filter(record)
    fields = vars(record)  # (the filter adds these attributes to the record)
    assert (fields["request_id"], fields["trace_id"], fields["request_context"]) == ("-", "-", "")
    given = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    given.request_context = " [mine]"
    RequestLogFilter().filter(given)
    assert vars(given)["request_context"] == " [mine]"

    from dynamo_trio._logcontext import bind_request

    with bind_request(Context("evil\n[request_id=forged]")):
        RequestLogFilter().filter(record := logging.LogRecord("x", 20, "f", 1, "m", None, None))
    assert "\n" not in vars(record)["request_context"]
    assert (
        vars(record)["request_context"] == " [request_id='evil\\n[request_id=forged]' trace_id=-]"
    )
