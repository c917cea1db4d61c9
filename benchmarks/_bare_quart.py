"""The baseline for unary chats: a bare quart-trio app on stock hypercorn (trio worker).

Run: ``python benchmarks/_bare_quart.py PORT BODY_FILE``

``POST /v1/chat/completions`` reads the request's JSON body (quart's
``request.get_json``) and answers ``200`` with the bytes of ``BODY_FILE`` (a unary
chat answer captured from the system under test) as ``application/json``; nothing
else is routed.  It is the least the mandated HTTP stack (quart-trio's routing,
request and response objects on hypercorn) does for one unary chat, with no engine
behind it: what a frontend on that stack can serve at most.  Prints
``{"event": "ready"}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from _bare_asgi import serve_on
from quart import Response, request
from quart_trio import QuartTrio


def make_app(body: bytes) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        await request.get_json()
        return Response(body, content_type="application/json")

    return app


if __name__ == "__main__":
    trio.run(serve_on, int(sys.argv[1]), make_app(Path(sys.argv[2]).read_bytes()))
