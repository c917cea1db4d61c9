"""The floor for paced streams: a bare HTTP/1.1 server on trio sockets, no framework.

Run: ``python benchmarks/_bare_trio.py PORT BODY_FILE STREAM_FILE``

Reads each request's head and ``content-length`` body (nothing is parsed beyond
that), and answers every request with the events of ``STREAM_FILE`` (a paced stream
captured from the system under test) as a chunked response, one event every 10 ms,
the first at once, each in one ``send_all``.  It is what trio itself costs to wake up
once and write once per token: any frontend on trio pays at least this much per
chunk.  ``BODY_FILE`` is not read (the argument keeps ``_bare_quart.py``'s form).
Prints ``{"event": "ready"}``.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from _bare_quart import PACE, split_events

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(events: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(event), event) for event in events] + [b"0\r\n\r\n"]


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> bool:
    """Consume one request (head and body) from ``buffer`` and ``stream``; False at EOF."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if not (data := await stream.receive_some(65536)):
            return False
        buffer += data
    length = 0
    for line in bytes(buffer[:end]).split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    del buffer[: end + 4]
    while len(buffer) < length:
        if not (data := await stream.receive_some(65536)):
            return False
        buffer += data
    del buffer[:length]
    return True


def make_handler(chunks: list[bytes]) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def handle(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while await read_request(stream, buffer):
                await stream.send_all(HEAD + chunks[0])
                start = trio.current_time()
                for i, chunk in enumerate(chunks[1:-1], 1):
                    await trio.sleep_until(start + i * PACE)
                    await stream.send_all(chunk)
                await stream.send_all(chunks[-1])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    return handle


async def main(port: int, events: list[bytes]) -> None:
    handle = make_handler(chunked(events))
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_tcp, handle, port, host="127.0.0.1"))
        print(json.dumps({"event": "ready"}), flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), split_events(Path(sys.argv[3]).read_bytes()))
