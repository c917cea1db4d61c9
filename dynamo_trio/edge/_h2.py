"""hypercorn's HTTP/2 sending, fair (:class:`RoundRobin`) and with fewer trips
(:func:`send_whole_response`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import suppress
from typing import TYPE_CHECKING, Final, final

import h2.errors
import h2.exceptions
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.utils import build_and_validate_headers
from priority.priority import DeadlockError, DuplicateStreamError, MissingStreamError

if TYPE_CHECKING:
    from hypercorn.typing import ASGISendCallable

Headers = list[tuple[bytes, bytes]]


async def send_whole_response(
    send: ASGISendCallable, headers: Headers, body: bytes, trailers: Headers
) -> bool:
    """Send a ``200`` with ``headers``, ``body`` and ``trailers`` (a unary gRPC call's) in
    one write from the app's task on the HTTP/2 stream whose ASGI ``send`` this is, then close
    it; ``False`` (nothing sent, the caller uses ASGI) if not hypercorn's HTTP/2 stream,
    already started, without ``te: trailers``, or over the stream's flow control window."""
    stream = getattr(send, "__self__", None)
    if type(stream) is not HTTPStream or stream.closed or stream.state != ASGIHTTPState.REQUEST:
        return False
    protocol = getattr(stream.send, "__self__", None)
    if type(protocol) is not H2Protocol or (b"te", b"trailers") not in stream.scope["headers"]:
        return False
    connection = protocol.connection
    stream_id = stream.stream_id
    buffer = protocol.stream_buffers.get(stream_id)
    if buffer is None or buffer.buffer:
        return False
    try:
        if len(body) > connection.local_flow_control_window(stream_id):
            return False
    except h2.exceptions.ProtocolError:  # the client reset the stream
        return False
    head = build_and_validate_headers(headers)
    stream.response = {"type": "http.response.start", "status": 200, "headers": head}
    stream.state = ASGIHTTPState.CLOSED  # what the app sends from now on is an error
    # The stream leaves the sending task's care before anything can yield.
    del protocol.stream_buffers[stream_id]
    protocol.priority.remove_stream(stream_id)
    try:
        connection.send_headers(
            stream_id, [(b":status", b"200"), *head, *stream.config.response_headers("h2")]
        )
        size = connection.max_outbound_frame_size
        for start in range(0, len(body), size):
            connection.send_data(stream_id, body[start : start + size])
        connection.send_headers(stream_id, build_and_validate_headers(trailers), end_stream=True)
    except h2.exceptions.ProtocolError:  # headers h2 refuses: the stream ends, reset
        with suppress(h2.exceptions.ProtocolError):
            connection.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
    await protocol._flush()
    await stream.config.log.access(stream.scope, stream.response, time.time() - stream.start_time)
    await protocol.stream_send(StreamClosed(stream_id=stream_id))
    return True


@final
class RoundRobin:
    """The active streams in turn, in the place of hypercorn's priority tree (under which a
    stream that ended while new ones kept coming was never reached); like the tree, each call
    but :meth:`insert_stream` raises ``priority.MissingStreamError`` for a stream not in."""

    __slots__ = ("_active", "_turns")

    def __init__(self) -> None:
        self._active: dict[int, bool] = {}  # every stream: whether it has something to send
        # The line, each stream in it once: active streams in turn, and ones blocked or
        # removed since they joined (dropped at its front).
        self._turns: Final[OrderedDict[int, None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._active)

    def insert_stream(self, stream_id: int, **priority: object) -> None:
        """Add a stream, active (``DuplicateStreamError`` if it is in); ``priority`` is ignored."""
        if stream_id in self._active:
            raise DuplicateStreamError(f"stream {stream_id} is already scheduled")
        self._active[stream_id] = True
        self._turns.setdefault(stream_id)

    def reprioritize(self, stream_id: int, **priority: object) -> None:
        """Ignored (every stream is equal)."""
        self._check(stream_id)

    def remove_stream(self, stream_id: int) -> None:
        """Take a stream out."""
        self._check(stream_id)
        del self._active[stream_id]

    def block(self, stream_id: int) -> None:
        """The stream has nothing to send."""
        self._check(stream_id)
        self._active[stream_id] = False

    def unblock(self, stream_id: int) -> None:
        """The stream has something to send."""
        self._check(stream_id)
        self._active[stream_id] = True
        self._turns.setdefault(stream_id)

    def __iter__(self) -> RoundRobin:
        return self

    def __next__(self) -> int:
        """The next active stream, to the back of the line (``DeadlockError`` if none)."""
        turns = self._turns
        while turns:
            stream_id, _ = turns.popitem(last=False)
            if self._active.get(stream_id):
                turns[stream_id] = None
                return stream_id
        raise DeadlockError("no active stream")

    def _check(self, stream_id: int) -> None:
        if stream_id not in self._active:
            raise MissingStreamError(f"stream {stream_id} is not scheduled")
