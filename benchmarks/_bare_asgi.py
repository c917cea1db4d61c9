"""The baseline for ``GET /health``: a bare ASGI app on stock hypercorn (trio worker).

Run: ``python benchmarks/_bare_asgi.py PORT BODY_FILE``

Answers every HTTP request with ``200``, ``content-type: application/json`` and the
bytes of ``BODY_FILE`` (the frontend's own ``/health`` answer, captured by the
benchmark), served by ``hypercorn.trio.serve`` on ``127.0.0.1:PORT``: the least an
ASGI app on hypercorn can do for the same answer.  Prints ``{"event": "ready"}``.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve


def make_app(body: bytes) -> Any:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    answer = {"type": "http.response.body", "body": body}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        await send(start)
        await send(answer)

    return app


async def serve_on(port: int, app: Any) -> None:
    """Serve ``app`` on stock hypercorn at ``127.0.0.1:port``; print when ready."""
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, app, config, mode="asgi"))
        print(json.dumps({"event": "ready"}), flush=True)


if __name__ == "__main__":
    trio.run(serve_on, int(sys.argv[1]), make_app(Path(sys.argv[2]).read_bytes()))
