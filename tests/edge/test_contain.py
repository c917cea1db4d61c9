"""Whatever a request's code raises ends that request only: the server keeps serving.

hypercorn contains an ``Exception`` (a 500); anything else it lets through to
the connection's task group and the server.  These run real hypercorn on
127.0.0.1 with httpx clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

if TYPE_CHECKING:
    from collections.abc import Iterator

from dynamo_trio.edge import _edge, _server
from tests._memhttp import http_client

from ._serving import answer_lifespan, served, served_bare


@pytest.fixture(autouse=True)
def _fresh_log_limits() -> Iterator[None]:
    # The containment lines are rate-limited per process: each test gets its own burst.
    for module in (_edge, _server):
        module.limited_log.reset()
    yield
    for module in (_edge, _server):
        module.limited_log.reset()


class _Bug(BaseException):
    """Not an ``Exception``: what hypercorn's per-request handling does not catch."""


async def _stale_cancelled() -> BaseException:
    """A ``trio.Cancelled`` caught inside a scope that is over: raising it cancels nothing."""
    caught: BaseException | None = None
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            caught = exc
    assert caught is not None
    return caught


_RAISED: dict[str, Any] = {
    "/base-exception": _Bug,
    "/generator-exit": GeneratorExit,
    "/keyboard-interrupt": KeyboardInterrupt,
    "/system-exit": SystemExit,
    "/exception": RuntimeError,
}


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    path = scope["path"]
    if path.startswith("/after-start"):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        path = path.removeprefix("/after-start")
    if path == "/stale-cancelled":
        raise await _stale_cancelled()
    if path in _RAISED:
        raise _RAISED[path]("from the app")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"fine"})


async def _fails_alone(url: str, path: str) -> None:
    """``path`` fails (a 500 before the response started, a cut connection after);
    another keep-alive connection, and the failing client's next one, are served."""
    async with (
        http_client(url) as other,
        http_client(url) as failing,
    ):
        assert (await other.get("/")).text == "fine"  # a keep-alive connection, open
        with trio.fail_after(5):
            assert (await failing.get(path)).status_code == 500
            with pytest.raises(httpx.RemoteProtocolError):  # started: the connection is cut
                await failing.get("/after-start" + path)
            assert (await other.get("/")).text == "fine"
            assert (await failing.get("/")).text == "fine"


_PATHS = [*sorted(_RAISED), "/stale-cancelled"]


@pytest.mark.parametrize("path", _PATHS)
async def test_behind_the_edge_a_request_raising_anything_ends_only_itself(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    exits: list[str] = []
    async with trio.open_nursery() as nursery:
        url = await served(nursery, _app, request_exit=lambda: exits.append(path))
        await _fails_alone(url, path)
        nursery.cancel_scope.cancel()
    asked = path in ("/keyboard-interrupt", "/system-exit")
    assert exits == ([path, path] if asked else [])  # the graceful exit, once per request
    # The edge ended the request, and said which one; no connection failed as a whole.
    assert not [r for r in caplog.records if r.name == "dynamo_trio.http"]
    if path != "/exception":  # (hypercorn's own to log)
        logged = [r.getMessage() for r in caplog.records if r.name == "dynamo_trio.edge"]
        assert len(logged) == 2
        for message, at in zip(logged, (path, "/after-start" + path), strict=True):
            assert message.startswith(f"GET {at} raised ")


@pytest.mark.parametrize("path", ["/base-exception", "/stale-cancelled"])
async def test_without_the_edge_the_connection_ends_not_the_server(path: str) -> None:
    # serve_http's own per-connection containment, for an app that is not an Edge:
    # hypercorn has answered 500 (or cut the response) on its way out; then the
    # failing connection is closed, and only it.
    async with trio.open_nursery() as nursery:
        url = await served_bare(nursery, _app)
        async with http_client(url) as other:
            assert (await other.get("/")).text == "fine"
            async with http_client(url) as failing:
                with trio.fail_after(5):
                    assert (await failing.get(path)).status_code == 500
                    with pytest.raises(httpx.RemoteProtocolError):
                        await failing.get("/after-start" + path)
                    assert (await failing.get("/")).text == "fine"
            assert (await other.get("/")).text == "fine"
        nursery.cancel_scope.cancel()


async def test_a_flood_of_failing_requests_is_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with trio.open_nursery() as nursery:
        url = await served(nursery, _app)
        async with http_client(url) as client:
            for _ in range(20):
                assert (await client.get("/base-exception")).status_code == 500
            assert (await client.get("/")).text == "fine"
        nursery.cancel_scope.cancel()
    logged = [r for r in caplog.records if r.name == "dynamo_trio.edge"]
    assert 1 <= len(logged) <= 5  # the limiter's burst, then one line per 10 s
