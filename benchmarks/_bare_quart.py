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

import json
import sys
from functools import partial
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio


def make_app(body: bytes) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        await request.get_json()
        return Response(body, content_type="application/json")

    return app


async def main(port: int, body: bytes) -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, make_app(body), config))
        print(json.dumps({"event": "ready"}), flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), Path(sys.argv[2]).read_bytes())
