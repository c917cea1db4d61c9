"""The request plane's connection state machine, sans I/O.

Theory of operation
===================

:class:`ProtocolConnection` knows everything about what may be said on one
connection and nothing about sockets or trio, in the manner of h11: bytes go
in through :meth:`~ProtocolConnection.receive_data` and come back as the frames
the caller must act on; frames go out through :meth:`~ProtocolConnection.send`
and accumulate as bytes for :meth:`~ProtocolConnection.data_to_send`.

Two rules keep the state machine in one place:

1. Everything that decides whether a frame is *allowed* lives here: the
   handshake, which side may send which frame, stream ids, the stream table,
   the stream limit, and credit accounting.  The I/O layer never re-checks.
2. Benign races are absorbed here, silently: a ``ctl`` or ``credit`` that
   crossed its stream's terminal frame, an ``item`` or ``end`` for a stream the
   client already killed.  Such frames are not returned.  Anything else that is
   out of place raises :class:`~dynamo_trio.ProtocolError`, after queueing a
   ``close`` frame that tells the peer why (the caller flushes it best-effort
   and drops the connection).

Some requests are answered here without involving the caller at all: a
``req`` beyond the stream limit gets an ``err`` ``ResourceExhausted``, and one
that arrives after ``goaway`` gets an ``err`` ``EngineShutdown``.

Credits: the client grants ``window`` credits in ``req`` and more with
``credit``; each ``item`` costs one.  The server must hold a credit to send an
item (:meth:`ProtocolConnection.credits`); a client that receives more items
than it granted has a misbehaving peer.
"""

from __future__ import annotations

import enum
import hmac
from contextlib import suppress
from typing import TYPE_CHECKING, Final

from .._errors import EngineShutdown, InvalidArgument, ProtocolError, ResourceExhausted
from ._frames import (
    PROTOCOL_VERSION,
    Close,
    Control,
    Credit,
    End,
    Error,
    FrameDecoder,
    GoAway,
    Hello,
    Item,
    Ping,
    Request,
    Welcome,
    _tag,
    encode_frame,
)

if TYPE_CHECKING:
    from ._frames import Frame

__all__ = ["ConnectionState", "ProtocolConnection", "Role"]


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class ConnectionState(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


class _StreamState:
    """Per-stream bookkeeping: credits left (server) or granted and received (client)."""

    __slots__ = ("credits", "granted", "received")

    def __init__(self, window: int) -> None:
        self.credits = window
        self.granted = window
        self.received = 0


_SERVER_RECEIVES: Final = (Hello, Request, Control, Credit, Ping, Close)
_CLIENT_RECEIVES: Final = (Welcome, Item, End, Error, GoAway, Ping, Close)


class ProtocolConnection:
    """One end of a request-plane connection, as a pure state machine.

    Args:
        role: Which end this is.  Clients open streams; servers answer them.
        max_frame_size: Largest frame body accepted or sent.
        max_streams: (server) Concurrent streams accepted on this connection.
        token: (server) The shared token a client must present, or ``None``
            for no authentication; (client) the token to present.
        peer_name: A name for this end, sent in the handshake (for logs).
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_size: int,
        max_streams: int = 1024,
        token: str | None = None,
        peer_name: str = "",
    ) -> None:
        self.role: Final = role
        self.state = ConnectionState.HANDSHAKE
        self.peer_name = ""
        """The other end's name, from its handshake frame."""
        self.goaway = False
        """Server: ``goaway`` was sent.  Client: it was received (open no new streams)."""
        self._max_frame_size = max_frame_size
        self._max_streams = max_streams
        self._token = token
        self._own_name = peer_name
        self._decoder = FrameDecoder(max_frame_size)
        self._outbox = bytearray()
        self._streams: dict[int, _StreamState] = {}
        self._killed: set[int] = set()  # (client) killed streams still owed a terminal frame
        self._last_sid = 0

    # ------------------------------------------------------------------ queries

    @property
    def open_streams(self) -> int:
        """Streams opened and not yet ended (from this end's point of view)."""
        return len(self._streams)

    def is_open(self, sid: int) -> bool:
        return sid in self._streams

    def credits(self, sid: int) -> int:
        """(server) Items that may be sent on ``sid`` now; 0 for an unknown stream."""
        stream = self._streams.get(sid)
        return 0 if stream is None else stream.credits

    @property
    def outbox_size(self) -> int:
        return len(self._outbox)

    # ------------------------------------------------------------------ outbound

    def start(self) -> None:
        """(client) Queue the handshake frame.  Call once, first."""
        assert self.role is Role.CLIENT
        assert self.state is ConnectionState.HANDSHAKE
        self._encode(Hello(PROTOCOL_VERSION, self._token, self._own_name))

    def next_sid(self) -> int:
        """(client) The id for the next stream."""
        return self._last_sid + 1

    def send(self, frame: Frame) -> None:
        """Queue ``frame`` for sending, updating the stream table.

        Raises:
            InvalidArgument: if the frame is too large or holds a value
                msgpack cannot encode (the state is left unchanged).
            RuntimeError: if the frame is not allowed now (a local bug).
        """
        if self.state is ConnectionState.CLOSED:
            raise RuntimeError("the connection is closed")
        if isinstance(frame, Item):
            stream = self._streams.get(frame.sid)
            if stream is None or stream.credits <= 0:
                raise RuntimeError(f"no credit to send an item on stream {frame.sid}")
            self._encode(frame)
            stream.credits -= 1
        elif isinstance(frame, End | Error):
            if frame.sid not in self._streams:
                raise RuntimeError(f"stream {frame.sid} is not open")
            self._encode(frame)
            del self._streams[frame.sid]
        elif isinstance(frame, Request):
            if frame.sid <= self._last_sid or frame.window <= 0:
                raise RuntimeError(f"bad stream id {frame.sid} or window {frame.window}")
            self._encode(frame)
            self._last_sid = frame.sid
            self._streams[frame.sid] = _StreamState(frame.window)
        elif isinstance(frame, Control):
            if frame.sid in self._streams:
                self._encode(frame)
                if frame.action == "kill":
                    # Whatever still arrives for it, up to its terminal frame, is dropped.
                    del self._streams[frame.sid]
                    self._killed.add(frame.sid)
        elif isinstance(frame, Credit):
            stream = self._streams.get(frame.sid)
            if stream is not None:
                self._encode(frame)
                stream.granted += frame.items
        elif isinstance(frame, GoAway):
            self._encode(frame)
            self.goaway = True
        elif isinstance(frame, Close):
            self._encode(frame)
            self.state = ConnectionState.CLOSED
        else:
            self._encode(frame)

    def data_to_send(self) -> bytearray:
        """Take everything queued so far (possibly empty)."""
        data, self._outbox = self._outbox, bytearray()
        return data

    def _encode(self, frame: Frame) -> None:
        encode_frame(frame, self._outbox, self._max_frame_size)

    # ------------------------------------------------------------------ inbound

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Feed received bytes; return the frames the caller must act on, in order.

        Raises:
            ProtocolError: the peer broke the protocol; a ``close`` frame
                explaining why has been queued.
        """
        if self.state is ConnectionState.CLOSED:
            return []
        try:
            frames = self._decoder.feed(data)
            accepted: list[Frame] = []
            for frame in frames:
                if self._accept(frame):
                    accepted.append(frame)
                if isinstance(frame, Close):
                    break  # nothing after a close counts, however TCP split the bytes
            return accepted
        except ProtocolError as exc:
            self._fail("protocol_error", exc.message)
            raise

    def _fail(self, code: str, message: str) -> None:
        if self.state is not ConnectionState.CLOSED:
            with suppress(InvalidArgument):
                self._encode(Close(code, message[:1000]))
            self.state = ConnectionState.CLOSED

    def _accept(self, frame: Frame) -> bool:
        if isinstance(frame, Close):
            self.state = ConnectionState.CLOSED
            return True
        if self.role is Role.SERVER:
            if not isinstance(frame, _SERVER_RECEIVES):
                raise ProtocolError(f"a client may not send {_tag(frame)!r} frames")
            return self._server_accept(frame)
        if not isinstance(frame, _CLIENT_RECEIVES):
            raise ProtocolError(f"a server may not send {_tag(frame)!r} frames")
        return self._client_accept(frame)

    def _server_accept(self, frame: Frame) -> bool:
        if self.state is ConnectionState.HANDSHAKE:
            if not isinstance(frame, Hello):
                raise ProtocolError(f"expected a 'hello' frame first, got {_tag(frame)!r}")
            if frame.version != PROTOCOL_VERSION:
                raise ProtocolError(
                    f"unsupported protocol version {frame.version}; "
                    f"this server speaks {PROTOCOL_VERSION}"
                )
            if self._token is not None and not (
                frame.token is not None
                and hmac.compare_digest(frame.token.encode(), self._token.encode())
            ):
                self._fail("unauthenticated", "missing or wrong request-plane token")
                raise ProtocolError("client failed authentication (missing or wrong token)")
            self.peer_name = frame.peer
            self.state = ConnectionState.OPEN
            self._encode(
                Welcome(PROTOCOL_VERSION, self._own_name, self._max_streams, self._max_frame_size)
            )
            return True
        if isinstance(frame, Request):
            if frame.sid <= self._last_sid:
                raise ProtocolError(
                    f"stream id {frame.sid} is not above the last one ({self._last_sid})"
                )
            if frame.window <= 0:
                raise ProtocolError(f"stream {frame.sid} opened with a window of {frame.window}")
            self._last_sid = frame.sid
            if self.goaway:
                self._refuse(frame.sid, EngineShutdown("the worker is shutting down"))
                return False
            if len(self._streams) >= self._max_streams:
                self._refuse(
                    frame.sid,
                    ResourceExhausted(
                        f"too many concurrent streams on this connection "
                        f"(limit {self._max_streams})"
                    ),
                )
                return False
            self._streams[frame.sid] = _StreamState(frame.window)
            return True
        if isinstance(frame, Control | Credit):
            if frame.sid > self._last_sid or frame.sid <= 0:
                raise ProtocolError(f"{_tag(frame)!r} frame for stream {frame.sid}, never opened")
            if isinstance(frame, Credit) and frame.items <= 0:
                raise ProtocolError(f"credit of {frame.items} items on stream {frame.sid}")
            stream = self._streams.get(frame.sid)
            if stream is None:
                return False  # the stream ended: this crossed its terminal frame
            if isinstance(frame, Credit):
                stream.credits += frame.items
            return True
        if isinstance(frame, Hello):
            raise ProtocolError("a second 'hello' frame")
        return self._common(frame)

    def _refuse(self, sid: int, error: EngineShutdown | ResourceExhausted) -> None:
        self._encode(Error(sid, error.error_type, error.message))

    def _client_accept(self, frame: Frame) -> bool:
        if self.state is ConnectionState.HANDSHAKE:
            if isinstance(frame, Welcome):
                if frame.version != PROTOCOL_VERSION:
                    raise ProtocolError(f"server answered with protocol version {frame.version}")
                self.peer_name = frame.peer
                self.state = ConnectionState.OPEN
                return True
            raise ProtocolError(f"expected a 'welcome' frame first, got {_tag(frame)!r}")
        if isinstance(frame, Item | End | Error):
            stream = self._streams.get(frame.sid)
            if stream is None:
                if frame.sid not in self._killed:
                    raise ProtocolError(
                        f"{_tag(frame)!r} frame for unknown stream {frame.sid} (not open)"
                    )
                if not isinstance(frame, Item):
                    self._killed.discard(frame.sid)  # its terminal frame: nothing more owed
                return False  # a stream we killed: the frame crossed our kill
            if isinstance(frame, Item):
                stream.received += 1
                if stream.received > stream.granted:
                    raise ProtocolError(
                        f"stream {frame.sid} received more items than the "
                        f"{stream.granted} credits granted"
                    )
            else:
                del self._streams[frame.sid]
            return True
        if isinstance(frame, GoAway):
            self.goaway = True
            return True
        if isinstance(frame, Welcome):
            raise ProtocolError("a second 'welcome' frame")
        return self._common(frame)

    def _common(self, frame: Frame) -> bool:
        if isinstance(frame, Ping):
            return False
        raise ProtocolError(f"unexpected {_tag(frame)!r} frame")  # pragma: no cover
