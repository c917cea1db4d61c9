"""The baselines for chats: a bare quart-trio app on stock hypercorn (trio worker).

Run: ``python benchmarks/_bare_quart.py PORT BODY_FILE [STREAM_FILE]``

``POST /v1/chat/completions`` reads the request's JSON body (quart's
``request.get_json``).  A unary chat is answered ``200`` with the bytes of
``BODY_FILE`` (a unary chat answer captured from the system under test) as
``application/json``.  A chat with ``"stream": true`` is answered with the events
of ``STREAM_FILE`` (a paced stream captured from the system under test), one every
``PACE`` seconds, the first at once, as a quart streaming response: the paced
model's rhythm.  Nothing else is routed.  It is the least the mandated HTTP stack
(quart-trio's routing, request and response objects on hypercorn) does for one
chat, with no engine behind it.  Prints ``{"event": "ready"}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from _bare_asgi import serve_on
from quart import Response, request
from quart_trio import QuartTrio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

PACE = 0.010  # the paced model's seconds per token


def make_app(body: bytes, events: list[bytes]) -> QuartTrio:
    app = QuartTrio(__name__)

    async def paced() -> AsyncIterator[bytes]:
        start = trio.current_time()
        yield events[0]
        for i, event in enumerate(events[1:], 1):
            await trio.sleep_until(start + i * PACE)
            yield event

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        payload = await request.get_json()
        if payload.get("stream"):
            return Response(paced(), content_type="text/event-stream")
        return Response(body, content_type="application/json")

    return app


def split_events(stream: bytes) -> list[bytes]:
    """A captured SSE body's events, each with its blank line."""
    blocks = stream.replace(b"\r\n", b"\n").split(b"\n\n")
    return [block + b"\n\n" for block in blocks if block]


if __name__ == "__main__":
    stream = Path(sys.argv[3]).read_bytes() if len(sys.argv) > 3 else b""
    app = make_app(Path(sys.argv[2]).read_bytes(), split_events(stream))
    trio.run(serve_on, int(sys.argv[1]), app)
