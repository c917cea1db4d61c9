"""The request plane's connection state machine, sans I/O (in the manner of h11).

:data:`RECEIVE` and :data:`SEND` map ``(role, state, frame type)`` to an action and the
next state; each action names the method that carries it out, so the tables are the
dispatch (docs/protocol.md has the rules they encode).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from contextlib import closing, suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NoReturn, get_args

from .._errors import DynamoError, EngineShutdown, InvalidArgument, ProtocolError, ResourceExhausted
from ._frames import (
    HANDSHAKE_MAX_FRAME_SIZE,
    NONCE_SIZE,
    PROTOCOL_VERSION,
    Auth,
    Challenge,
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
    RawRequest,
    Request,
    Welcome,
    WireFrame,
    encode_frame,
    frame_tag,
)
from ._validate import MAX_CREDIT, validate_request

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ._frames import Frame

    _OnReceive = Callable[["ProtocolConnection", Any], Frame | None]
    _OnSend = Callable[["ProtocolConnection", Any], bool]


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class ConnectionState(enum.Enum):
    AWAIT_HELLO = "awaiting hello"  # (server) accepted, no ``hello`` yet
    AWAIT_CHALLENGE = "awaiting challenge"  # (client) ``hello`` sent
    AWAIT_AUTH = "awaiting auth"  # (server) ``challenge`` sent
    AUTHENTICATING = "authenticating"  # (server) ``auth`` held for authenticate()
    AWAIT_WELCOME = "awaiting welcome"  # (client) ``auth`` sent
    OPEN = "open"
    DRAINING = "draining"  # after ``goaway``: open streams go on, new ones are refused
    CLOSED = "closed"

    @property
    def handshaking(self) -> bool:
        return self in _EXPECTED


class Receive(enum.Enum):
    """The actions of :data:`RECEIVE`, each carried out by ``ProtocolConnection._on_<name>``."""

    VIOLATION = "protocol violation: queue close, end the connection"
    DROP = "ignore it: the connection is closed"
    PEER_CLOSE = "the peer is closing: end the connection, return the frame"
    LIFE = "a sign of life, nothing else (not returned)"
    HELLO = "check the version, queue a challenge"
    CHALLENGE = "check the version, queue auth with our proof"
    AUTH = "hold the proof for authenticate()"
    WELCOME = "check the server's proof, open, return the frame"
    GOAWAY = "no new streams from now on, return the frame"
    REQUEST = "validate, open the stream or refuse it with err, return it if opened"
    STREAM_CONTROL = "ctl/credit for a known stream: apply, return it"
    STREAM_RESPONSE = "item/end/err for a known stream: account, return it"


class Send(enum.Enum):
    """The actions of :data:`SEND`, each carried out by ``ProtocolConnection._send_<name>``."""

    BUG = "raise RuntimeError: this role never sends it here (a local bug)"
    DROP = "drop it silently, return False: the connection is closed or closing"
    PLAIN = "queue it (the table's next state does the rest: close, goaway)"
    REQUEST = "open the stream, queue it"
    ITEM = "spend a credit, queue it"
    TERMINAL = "end the stream, queue it"
    STREAM_CONTROL = "queue it if the stream is open: a kill forgets it, a credit is counted"


_S = ConnectionState
_FRAME_TYPES: Final = get_args(WireFrame)
_HANDSHAKE: Final = (Hello, Challenge, Auth, Welcome)
# The frames only one role sends: in the other role's receive table a violation (dropped
# once closed); in its send table, like the handshake frames, a bug in every state.
_SERVER_ONLY: Final = (Challenge, Welcome, GoAway, Item, End, Error)
_CLIENT_ONLY: Final = (Hello, Auth, RawRequest, Control, Credit)

# Each role's handshake states, then the ones both share (the tables' column order).
_SHARED_STATES: Final = (_S.OPEN, _S.DRAINING, _S.CLOSED)
SERVER_STATES: Final = (_S.AWAIT_HELLO, _S.AWAIT_AUTH, _S.AUTHENTICATING, *_SHARED_STATES)
CLIENT_STATES: Final = (_S.AWAIT_CHALLENGE, _S.AWAIT_WELCOME, *_SHARED_STATES)
_Key = tuple[Role, ConnectionState, type]


def _table(
    role: Role, states: tuple[_S, ...], omitted: tuple[type, ...], default: Any, rows: Any
) -> dict[_Key, Any]:
    """``rows`` keyed by ``(role, state, frame type)``; an ``omitted`` type gets ``default``."""
    assert set(rows).isdisjoint(omitted) and {*rows, *omitted} == set(_FRAME_TYPES)
    filler = (default[0],) * (len(states) - 1) + (default[1],)  # [1]: in CLOSED
    return {
        (role, state, frame_type): cell
        for frame_type in _FRAME_TYPES
        for state, cell in zip(states, rows.get(frame_type, filler), strict=True)
    }


# The cells of the tables: (action, next state; None = unchanged).
_Transition = tuple[Receive, ConnectionState | None]
_SendRule = tuple[Send, ConnectionState | None]
_R = Receive
_V, _DROP, _CLOSE = (_R.VIOLATION, _S.CLOSED), (_R.DROP, None), (_R.PEER_CLOSE, _S.CLOSED)
_LIFE, _HELLO, _AUTH = (_R.LIFE, None), (_R.HELLO, _S.AWAIT_AUTH), (_R.AUTH, _S.AUTHENTICATING)
_CHALL, _WELC = (_R.CHALLENGE, _S.AWAIT_WELCOME), (_R.WELCOME, _S.OPEN)
_GOAWAY, _REQ = (_R.GOAWAY, _S.DRAINING), (_R.REQUEST, None)
_CTL, _RESP = (_R.STREAM_CONTROL, None), (_R.STREAM_RESPONSE, None)
_BUG, _GONE, _PLAIN = (Send.BUG, None), (Send.DROP, None), (Send.PLAIN, None)
_SHUT, _GO = (Send.PLAIN, _S.CLOSED), (Send.PLAIN, _S.DRAINING)
_ITEM, _TERM = (Send.ITEM, None), (Send.TERMINAL, None)
_OPEN, _CTRL = (Send.REQUEST, None), (Send.STREAM_CONTROL, None)

# fmt: off
RECEIVE: Final[Mapping[_Key, _Transition]] = {
**_table(Role.SERVER, SERVER_STATES, _SERVER_ONLY, (_V, _DROP), {
    #            AWAIT_HELLO  AWAIT_AUTH  AUTHENTICATING  OPEN    DRAINING  CLOSED
    Hello:      (_HELLO,      _V,         _V,             _V,     _V,       _DROP),
    Auth:       (_V,          _AUTH,      _V,             _V,     _V,       _DROP),
    Ping:       (_V,          _V,         _V,             _LIFE,  _LIFE,    _DROP),
    Close:      (_CLOSE,      _CLOSE,     _CLOSE,         _CLOSE, _CLOSE,   _DROP),
    RawRequest: (_V,          _V,         _V,             _REQ,   _REQ,     _DROP),
    Control:    (_V,          _V,         _V,             _CTL,   _CTL,     _DROP),
    Credit:     (_V,          _V,         _V,             _CTL,   _CTL,     _DROP),
}),
**_table(Role.CLIENT, CLIENT_STATES, _CLIENT_ONLY, (_V, _DROP), {
    #            AWAIT_CHALLENGE  AWAIT_WELCOME  OPEN     DRAINING  CLOSED
    Challenge:  (_CHALL,          _V,            _V,      _V,       _DROP),
    Welcome:    (_V,              _WELC,         _V,      _V,       _DROP),
    Ping:       (_V,              _V,            _LIFE,   _LIFE,    _DROP),
    GoAway:     (_V,              _V,            _GOAWAY, _LIFE,    _DROP),
    Close:      (_CLOSE,          _CLOSE,        _CLOSE,  _CLOSE,   _DROP),
    Item:       (_V,              _V,            _RESP,   _RESP,    _DROP),
    End:        (_V,              _V,            _RESP,   _RESP,    _DROP),
    Error:      (_V,              _V,            _RESP,   _RESP,    _DROP),
}),
}
# fmt: on
"""``(role, state, received frame type) -> (action, next state or None for unchanged)``."""

# fmt: off
SEND: Final[Mapping[_Key, _SendRule]] = {
**_table(Role.SERVER, SERVER_STATES, (*_HANDSHAKE, *_CLIENT_ONLY), (_BUG, _BUG), {
    #            AWAIT_HELLO  AWAIT_AUTH  AUTHENTICATING  OPEN    DRAINING  CLOSED
    Ping:       (_BUG,        _BUG,       _BUG,           _PLAIN, _PLAIN,   _GONE),
    GoAway:     (_BUG,        _BUG,       _BUG,           _GO,    _GONE,    _GONE),
    Close:      (_SHUT,       _SHUT,      _SHUT,          _SHUT,  _SHUT,    _GONE),
    Item:       (_BUG,        _BUG,       _BUG,           _ITEM,  _ITEM,    _GONE),
    End:        (_BUG,        _BUG,       _BUG,           _TERM,  _TERM,    _GONE),
    Error:      (_BUG,        _BUG,       _BUG,           _TERM,  _TERM,    _GONE),
}),
**_table(Role.CLIENT, CLIENT_STATES, (*_HANDSHAKE, *_SERVER_ONLY), (_BUG, _BUG), {
    #            AWAIT_CHALLENGE  AWAIT_WELCOME  OPEN     DRAINING  CLOSED
    Ping:       (_BUG,            _BUG,          _PLAIN,  _PLAIN,   _GONE),
    Close:      (_SHUT,           _SHUT,         _SHUT,   _SHUT,    _GONE),
    RawRequest: (_BUG,            _BUG,          _OPEN,   _GONE,    _GONE),
    Control:    (_BUG,            _BUG,          _CTRL,   _CTRL,    _GONE),
    Credit:     (_BUG,            _BUG,          _CTRL,   _CTRL,    _GONE),
}),
}
# fmt: on
"""``(role, state, sent frame type) -> (action, next state or None)``; ``req`` is
keyed by :class:`RawRequest`, the wire type of the ``req`` tag."""

# What each handshake state waits for.
_EXPECTED: Final = {
    _S.AWAIT_HELLO: "a 'hello' frame first",
    _S.AWAIT_AUTH: "an 'auth' frame",
    _S.AUTHENTICATING: "nothing after 'auth' until the server's verdict",
    _S.AWAIT_CHALLENGE: "a 'challenge' frame first",
    _S.AWAIT_WELCOME: "a 'welcome' frame",
}


def _proof(label: bytes, token: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """``HMAC-SHA256(token, label + nonce_s + nonce_c)``."""
    return hmac.digest(token.encode(), label + server_nonce + client_nonce, hashlib.sha256)


client_proof: Final = partial(_proof, b"dynamo-trio/2 client\0")  # the answer to a challenge
# In ``welcome``; a different label, so that a proof is never reflected.
server_proof: Final = partial(_proof, b"dynamo-trio/2 server\0")


@dataclass(slots=True)
class _StreamState:
    """Per-stream bookkeeping: credits left (server) or granted and received (client)."""

    credits: int
    granted: int
    received: int = 0


class ProtocolConnection:
    """One end of a request-plane connection, as a pure state machine.

    ``max_frame_size`` applies once the handshake is complete; with a ``token`` each end
    proves it knows it (``None``: no authentication); ``peer_name`` is this end's name in
    the handshake; ``nonce`` is for tests.
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_size: int,
        max_streams: int = 1024,
        token: str | None = None,
        peer_name: str = "",
        nonce: bytes | None = None,
    ) -> None:
        self.role: Final = role
        self._on_receive: Mapping[type, tuple[_OnReceive, ConnectionState | None]] = {}
        self._on_send: Mapping[type, tuple[_OnSend, ConnectionState | None]] = {}
        self.state = _S.AWAIT_HELLO if role is Role.SERVER else _S.AWAIT_CHALLENGE
        self.peer_name = ""  # from the peer's handshake frame
        self.goaway = False  # sent (server) or received (client); stays true once closed
        self.close_frame: Close | None = None  # the peer's, if that is how it ended
        self.frames_received = 0  # valid ones: the I/O layer's sign of life
        self.refused_streams = 0  # (server) ``req`` answered with ``err`` unopened
        self._max_frame_size = max_frame_size
        self._max_streams = max_streams
        self._token = token
        self._own_name = peer_name
        self._nonce = secrets.token_bytes(NONCE_SIZE) if nonce is None else nonce
        self._peer_nonce = b""
        self._proof: bytes | None = None  # (server) the client's proof, until authenticate()
        self._decoder = FrameDecoder(HANDSHAKE_MAX_FRAME_SIZE)
        self._outbox = bytearray()
        self._streams: dict[int, _StreamState] = {}
        self._killed: set[int] = set()  # (client) killed streams still owed a terminal frame
        self._last_sid = 0

    @property
    def state(self) -> ConnectionState:
        """Where the connection is in its life (docs/protocol.md has the states)."""
        return self._state

    @state.setter
    def state(self, state: ConnectionState) -> None:
        self._state = state
        self._on_receive = _RECEIVE_DISPATCH[self.role, state]
        self._on_send = _SEND_DISPATCH[self.role, state]
        if state is _S.OPEN:
            self._decoder.max_frame_size = self._max_frame_size
        elif state is _S.DRAINING:
            self.goaway = True

    @property
    def closed(self) -> bool:
        return self.state is _S.CLOSED

    @property
    def is_established(self) -> bool:
        """The handshake completed and the connection is not closed (open or draining)."""
        return self.state is _S.OPEN or self.state is _S.DRAINING

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

    def start(self) -> None:
        """(client) Queue the ``hello`` frame.  Call once, first."""
        if self.role is not Role.CLIENT or self.state is not _S.AWAIT_CHALLENGE or self._outbox:
            raise RuntimeError("start() is for a new client connection, once")
        self._encode(Hello(PROTOCOL_VERSION, self._nonce, self._own_name))

    def next_sid(self) -> int:
        """(client) The id for the next stream."""
        return self._last_sid + 1

    def send(self, frame: Frame) -> bool:
        """Queue ``frame``, updating the stream table; ``False`` if dropped (closed, draining,
        or its stream ended).  InvalidArgument if it cannot be encoded (state unchanged);
        RuntimeError for a frame this role may not send here (a local bug)."""
        key = RawRequest if isinstance(frame, Request) else type(frame)
        on_send, next_state = self._on_send[key]
        if not on_send(self, frame):
            return False
        if next_state is not None:
            self.state = next_state
        return True

    def _send_bug(self, frame: Frame) -> NoReturn:
        raise RuntimeError(
            f"a {self.role.value} may not send {frame_tag(frame)!r} frames when {self.state.value}"
        )

    def _send_drop(self, frame: Frame) -> bool:
        return False

    def _send_plain(self, frame: Frame) -> bool:
        self._encode(frame)
        return True

    def _send_request(self, frame: Request) -> bool:
        if frame.sid <= self._last_sid or frame.window <= 0:
            raise RuntimeError(f"bad stream id {frame.sid} or window {frame.window}")
        self._encode(frame)
        self._last_sid = frame.sid
        self._streams[frame.sid] = _StreamState(frame.window, frame.window)
        return True

    def _send_item(self, frame: Item) -> bool:
        stream = self._streams.get(frame.sid)
        if stream is None or stream.credits <= 0:
            raise RuntimeError(f"no credit to send an item on stream {frame.sid}")
        self._encode(frame)
        stream.credits -= 1
        return True

    def _send_terminal(self, frame: End | Error) -> bool:
        if frame.sid not in self._streams:
            raise RuntimeError(f"stream {frame.sid} is not open")
        self._encode(frame)
        del self._streams[frame.sid]
        return True

    def _send_stream_control(self, frame: Control | Credit) -> bool:
        stream = self._streams.get(frame.sid)
        if stream is None:
            return False
        self._encode(frame)
        if isinstance(frame, Credit):
            stream.granted += frame.items
        elif frame.action == "kill":
            # Whatever still arrives for it, up to its terminal frame, is dropped.
            del self._streams[frame.sid]
            self._killed.add(frame.sid)
        return True

    def data_to_send(self) -> bytearray:
        """Take everything queued so far (possibly empty)."""
        data, self._outbox = self._outbox, bytearray()
        return data

    def unsend(self, rest: bytes | bytearray | memoryview) -> None:
        """Put back the unwritten tail of :meth:`data_to_send`'s bytes, ahead of all else."""
        self._outbox[:0] = rest

    def _encode(self, frame: Frame) -> None:
        encode_frame(frame, self._outbox, self._max_frame_size)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Feed received bytes; return the frames the caller must act on, in order.
        ProtocolError if the peer broke the protocol: a ``close`` saying why is queued,
        the state is ``CLOSED``, and this call's frames are lost."""
        if self.state is _S.CLOSED:
            return []
        accepted: list[Frame] = []
        try:
            with closing(self._decoder.frames(data)) as frames:  # its buffer view, released
                for wire_frame in frames:
                    on_receive, next_state = self._on_receive[type(wire_frame)]
                    frame = on_receive(self, wire_frame)
                    self.frames_received += 1
                    if frame is not None:
                        accepted.append(frame)
                    if next_state is not None:
                        self.state = next_state
                        if next_state is _S.CLOSED:
                            break  # nothing after a close counts, however TCP split the bytes
            if self.state is _S.AUTHENTICATING and self._decoder.buffered:
                raise ProtocolError("bytes after 'auth', before the server's verdict")
        except ProtocolError as exc:
            self._fail("protocol_error", exc.message)
            raise
        return accepted

    def _on_violation(self, frame: WireFrame) -> NoReturn:
        tag = frame_tag(frame)
        if isinstance(frame, _SERVER_ONLY if self.role is Role.SERVER else _CLIENT_ONLY):
            other = "server" if self.role is Role.CLIENT else "client"
            raise ProtocolError(f"a {other} may not send {tag!r} frames")
        expected = _EXPECTED.get(self.state)
        if expected is not None:
            raise ProtocolError(f"expected {expected}, got a {tag!r} frame")
        raise ProtocolError(f"an unexpected {tag!r} frame: the handshake is over")

    def _on_peer_close(self, frame: Close) -> Close:
        self.close_frame = frame
        return frame

    def _on_life(self, frame: WireFrame) -> None:
        """A sign of life, or a frame after the close (receive_data stops before those)."""

    _on_drop = _on_life

    def _on_goaway(self, frame: GoAway) -> GoAway:
        return frame

    def _fail(self, code: str, message: str) -> None:
        if self.state is not _S.CLOSED:
            with suppress(InvalidArgument):
                self._encode(Close(code, message[:1000]))
            self.state = _S.CLOSED

    def _check_version(self, version: int) -> None:
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"unsupported request-plane protocol version {version}; "
                f"this {self.role.value} speaks version {PROTOCOL_VERSION}"
            )

    def _take_nonce(self, frame: Hello | Challenge) -> None:
        self._check_version(frame.version)
        if len(frame.nonce) != NONCE_SIZE:
            raise ProtocolError(f"a {frame_tag(frame)} nonce must be {NONCE_SIZE} bytes")
        self._peer_nonce = frame.nonce

    def _on_hello(self, frame: Hello) -> None:
        self._take_nonce(frame)
        self.peer_name = frame.peer[:200]
        self._encode(Challenge(PROTOCOL_VERSION, self._nonce))

    def _on_challenge(self, frame: Challenge) -> None:
        self._take_nonce(frame)
        proof = None if self._token is None else client_proof(self._token, frame.nonce, self._nonce)
        self._encode(Auth(proof))

    def authenticate(self) -> bool:
        """(server, once ``AUTHENTICATING``) Judge the client's proof and queue ``welcome``
        (state ``OPEN``, returns True) or ``close`` (state ``CLOSED``, False)."""
        if self.role is not Role.SERVER or self.state is not _S.AUTHENTICATING:
            raise RuntimeError(f"authenticate() when {self.state.value}")
        answer, self._proof = self._proof, None
        proof = None  # ours, for welcome
        if self._token is not None:
            expected = client_proof(self._token, self._nonce, self._peer_nonce)
            if answer is None or not hmac.compare_digest(answer, expected):
                wrong = "missing or wrong request-plane token"
                need = "this worker requires a request-plane token (DYN_REQUEST_PLANE_TOKEN)"
                self._fail("unauthenticated", need if answer is None else wrong)
                return False
            proof = server_proof(self._token, self._nonce, self._peer_nonce)
        self.state = _S.OPEN
        limits = (self._max_streams, self._max_frame_size)
        self._encode(Welcome(PROTOCOL_VERSION, self._own_name, *limits, proof))
        return True

    def _on_auth(self, frame: Auth) -> None:
        self._proof = frame.proof

    def _on_welcome(self, frame: Welcome) -> Welcome:
        self._check_version(frame.version)
        if self._token is not None:
            expected = server_proof(self._token, self._peer_nonce, self._nonce)
            if frame.proof is None or not hmac.compare_digest(frame.proof, expected):
                why = "the worker did not prove it knows the request-plane token"
                self._fail("unauthenticated", why)
                raise ProtocolError(f"{why} (is DYN_REQUEST_PLANE_TOKEN the same on both sides?)")
        self.peer_name = frame.peer[:200]
        return frame

    def _on_request(self, raw: RawRequest) -> Request | None:
        if raw.sid <= self._last_sid:
            raise ProtocolError(f"stream id {raw.sid} is not above the last one ({self._last_sid})")
        self._last_sid = raw.sid
        try:
            frame = validate_request(raw)
            if self.state is _S.DRAINING:
                raise EngineShutdown("the worker is shutting down")
            if len(self._streams) >= self._max_streams:
                why = f"too many concurrent streams on this connection (limit {self._max_streams})"
                raise ResourceExhausted(why)
        except DynamoError as refusal:
            self.refused_streams += 1
            self._encode(Error(raw.sid, refusal.error_type, refusal.message))
            return None
        self._streams[frame.sid] = _StreamState(frame.window, frame.window)
        return frame

    def _on_stream_control(self, frame: Control | Credit) -> Control | Credit | None:
        if frame.sid > self._last_sid or frame.sid <= 0:
            raise ProtocolError(f"{frame_tag(frame)!r} frame for stream {frame.sid}, never opened")
        if isinstance(frame, Credit) and frame.items <= 0:
            raise ProtocolError(f"credit of {frame.items} items on stream {frame.sid}")
        stream = self._streams.get(frame.sid)
        if stream is None:
            return None  # the stream ended: this crossed its terminal frame
        if isinstance(frame, Credit):
            stream.credits += frame.items
            if stream.credits > MAX_CREDIT:
                raise ProtocolError(
                    f"stream {frame.sid} was granted more than {MAX_CREDIT} credits"
                )
        return frame

    def _on_stream_response(self, frame: Item | End | Error) -> Item | End | Error | None:
        stream = self._streams.get(frame.sid)
        if stream is None:
            if frame.sid not in self._killed:
                raise ProtocolError(
                    f"{frame_tag(frame)!r} frame for unknown stream {frame.sid} (not open)"
                )
            if not isinstance(frame, Item):
                self._killed.discard(frame.sid)  # its terminal frame: nothing more owed
            return None  # a stream we killed: the frame crossed our kill
        if isinstance(frame, Item):
            stream.received += 1
            if stream.received > stream.granted:
                raise ProtocolError(
                    f"stream {frame.sid} received more items than the "
                    f"{stream.granted} credits granted"
                )
        else:
            del self._streams[frame.sid]
        return frame


def _dispatch(table: Mapping[_Key, tuple[enum.Enum, _S | None]], prefix: str) -> dict[Any, Any]:
    """``table`` regrouped by ``(role, state)``, each action replaced by its method."""
    return {
        (role, state): {
            frame_type: (getattr(ProtocolConnection, prefix + action.name.lower()), next_state)
            for (r, s, frame_type), (action, next_state) in table.items()
            if r is role and s is state
        }
        for role, state in {key[:2] for key in table}
    }


_RECEIVE_DISPATCH: Final = _dispatch(RECEIVE, "_on_")
_SEND_DISPATCH: Final = _dispatch(SEND, "_send_")
