"""Each HTTP connection's protocol, guarded (:class:`GuardedProtocol`, in the place of
hypercorn's ``ProtocolWrapper``): cleartext HTTP/2 as a choice, a bound on a client's stream
resets, no 5xx for what a client sends, and the rest of a request answered early dropped
(``docs/security.md`` says why).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, final

import h2.errors
import h2.events
import h2.exceptions
import trio
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H2CProtocolRequiredError, H2ProtocolAssumedError, H11Protocol

from .._ratelimit import LogLimiter

if TYPE_CHECKING:
    import h11
    from hypercorn.events import Event
    from hypercorn.protocol import ProtocolWrapper

_log = logging.getLogger("dynamo_trio.http")
limited_log: Final = LogLimiter(_log)
"""What a connection can make the server log, at a bounded rate."""

_REFILL_PER_SECOND: Final = 0.1  # the share of max_resets back each second


@final
class GuardedProtocol:
    """hypercorn's per-connection protocol (``wrapped``), with the switch to HTTP/2 decided
    here; a client that resets more than ``max_resets`` streams in a burst gets ``GOAWAY``."""

    def __init__(self, wrapped: ProtocolWrapper, *, cleartext_http2: bool, max_resets: int) -> None:
        self._wrapped = wrapped
        self._cleartext_http2 = cleartext_http2
        self._max_resets = max_resets
        protocol = wrapped.protocol
        if isinstance(protocol, H2Protocol):
            self._guard(protocol)
        else:
            if not cleartext_http2:
                # hypercorn answers an upgrade to h2c (101) in this check, before any
                # switch could be refused: it is replaced by one that keeps HTTP/1.1.
                protocol._check_protocol = _http11_only  # type: ignore[method-assign]
            refuse = protocol._send_error_response

            async def refused(status_code: int) -> None:
                # h11's 501 is for a Transfer-Encoding it does not take: a bad request.
                await refuse(400 if status_code == 501 else status_code)

            protocol._send_error_response = refused  # type: ignore[method-assign]

    @property
    def protocol(self) -> H11Protocol | H2Protocol:
        return self._wrapped.protocol

    async def initiate(self) -> None:
        await self._wrapped.initiate()

    async def handle(self, event: Event) -> None:
        wrapped = self._wrapped
        try:
            await wrapped.protocol.handle(event)
        except H2ProtocolAssumedError as error:
            if self._cleartext_http2:
                await self._to_http2(error.data)
                return
            # Answered 505 (in HTTP/1.1), and the connection closed.
            limited_log.log(
                logging.INFO,
                "cleartext-http2-refused",
                "refused cleartext HTTP/2 from %s (set DYN_HTTP_CLEARTEXT_HTTP2=1 to serve it)",
                wrapped.client,
            )
            await wrapped.protocol._send_error_response(505)  # type: ignore[union-attr]
            await wrapped.send(Closed())
        except H2CProtocolRequiredError as error:
            await self._to_http2(error.data, error.headers, error.settings)

    async def _to_http2(self, data: bytes, *initiation: Any) -> None:
        """Switch the connection to HTTP/2 and hand it ``data``, what followed the switch."""
        w = self._wrapped
        protocol = H2Protocol(
            w.app, w.config, w.context, w.task_group, w.state, w.ssl, w.client, w.server, w.send
        )
        self._guard(protocol)
        w.protocol = protocol
        await protocol.initiate(*initiation)
        if data:
            await protocol.handle(RawData(data=data))

    def _guard(self, protocol: H2Protocol) -> None:
        """Count the client's resets (a token bucket of ``max_resets``); let a closed stream's
        late data in (:class:`_Streams`)."""
        protocol.streams = _Streams(protocol.streams)
        connection = protocol.connection
        receive = connection.receive_data
        most = self._max_resets
        left, at = float(most), trio.current_time()
        client = self._wrapped.client

        def receive_data(data: Any) -> list[h2.events.Event]:
            nonlocal left, at
            events: list[h2.events.Event] = receive(data)
            resets = sum(1 for event in events if isinstance(event, h2.events.StreamReset))
            if not resets:
                return events
            now = trio.current_time()
            left = min(float(most), left + (now - at) * most * _REFILL_PER_SECOND) - resets
            at = now
            if left < 0:
                limited_log.warning(
                    "rapid-reset",
                    "HTTP/2 client %s reset more than %d streams: GOAWAY (ENHANCE_YOUR_CALM)",
                    client,
                    self._max_resets,
                )
                connection.close_connection(error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                # hypercorn then sends what is queued (the GOAWAY) and closes.
                raise h2.exceptions.ProtocolError("too many stream resets")
            return events

        connection.receive_data = receive_data  # type: ignore[method-assign]


@final
class _Streams(dict[int, Any]):
    """hypercorn's HTTP/2 streams, where one it closed (answered early) ignores late frames:
    hypercorn's lookup of a ``DATA`` frame's stream was a ``KeyError`` ending the connection."""

    def __missing__(self, stream_id: int) -> _ClosedStream:
        return _CLOSED


@final
class _ClosedStream:
    async def handle(self, event: Event) -> None:
        """Nothing: the stream is over."""


_CLOSED: Final = _ClosedStream()


async def _http11_only(event: h11.Request) -> None:
    """hypercorn's protocol check, keeping HTTP/1.1 (a preface is refused, h2c ignored)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
        raise H2ProtocolAssumedError(b"")
