"""quart-trio's request handling with the view in the request's own task (``_ViewFirst``).

The contract is quart-trio's own: the view's end ends the reader of the ASGI
messages, and a disconnect the reader hears cancels the view.  What changes is
only where the view runs: in the task that called the app, a scheduler pass
sooner.  In memory, with a plain quart-trio app; the frontend's end-to-end
disconnect tests run the same class under hypercorn.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import trio
import trio.lowlevel
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection

from dynamo_trio._config import FrontendConfig
from dynamo_trio.frontend._app import VIEW_FIRST, _view_first_fits, _ViewFirst, build_app

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

Message = dict[str, Any]


def make_app(view: Callable[[], Awaitable[str]]) -> QuartTrio:
    app = QuartTrio(__name__)
    app.asgi_http_class = _ViewFirst
    app.add_url_rule("/", "view", view, methods=["POST"])
    return app


def http_scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"content-length", b"2")],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 80),
        "extensions": {},
    }


BODY: Message = {"type": "http.request", "body": b"{}", "more_body": False}


async def test_the_view_runs_in_the_task_that_called_the_app() -> None:
    tasks: list[trio.lowlevel.Task] = []

    async def view() -> str:
        tasks.append(trio.lowlevel.current_task())
        return "ok"

    messages = [BODY]

    async def receive() -> Message:
        if messages:
            return messages.pop()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    with trio.fail_after(5):  # the view's end ended the reader, still waiting for more
        await make_app(view)(http_scope(), receive, send)  # type: ignore[arg-type]
    assert tasks == [trio.lowlevel.current_task()]
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"ok"


async def test_a_disconnect_cancels_the_view() -> None:
    view_started = trio.Event()
    outcome: list[str] = []

    async def view() -> str:
        view_started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            outcome.append("cancelled")
            raise
        return "never"

    calls = 0

    async def receive() -> Message:
        nonlocal calls
        calls += 1
        if calls == 1:
            return BODY
        await view_started.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        outcome.append(message["type"])

    with trio.fail_after(5):
        await make_app(view)(http_scope(), receive, send)  # type: ignore[arg-type]
    assert outcome == ["cancelled"]  # nothing was sent to a client that left


def test_the_installed_quart_trio_fits_and_is_used() -> None:
    # The frontend runs its views first with the quart-trio it is tested with.
    assert VIEW_FIRST
    app = build_app(SimpleNamespace(config=FrontendConfig()))  # type: ignore[arg-type]
    assert app.asgi_http_class is _ViewFirst


def test_a_quart_trio_whose_request_handling_changed_keeps_its_own() -> None:
    # Were a quart-trio release to change what _ViewFirst calls, the frontend would
    # fall back to quart-trio's own class instead of failing on every request.
    class ExtraParameter(TrioASGIHTTPConnection):
        async def handle_request(  # type: ignore[override]
            self, nursery: trio.Nursery, request: Any, send: Any, extra: int = 0
        ) -> None: ...

    class NotAsync(TrioASGIHTTPConnection):
        def handle_messages(self, nursery: Any, request: Any, receive: Any) -> None:  # type: ignore[override]
            return None

    class Missing(TrioASGIHTTPConnection):
        _create_request_from_scope = None  # type: ignore[assignment]

    assert _view_first_fits(TrioASGIHTTPConnection)
    for changed in (ExtraParameter, NotAsync, Missing):
        assert not _view_first_fits(changed), changed.__name__
