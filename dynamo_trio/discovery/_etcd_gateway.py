"""A small client for etcd v3's JSON gRPC gateway (proto3's JSON mapping: base64 bytes, 64-bit
integers as strings, zero values omitted), moving requests and watches to the next endpoint
when the current one fails."""

from __future__ import annotations

import logging
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Final, Literal, cast, final

import httpx
import msgspec
import trio

from ._base import DiscoveryError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Sequence

logger = logging.getLogger(__name__)

GRPC_NOT_FOUND: Final = 5
GRPC_ALREADY_EXISTS: Final = 9
GRPC_UNAVAILABLE: Final = 14

_FAILOVER_HTTP_STATUS: Final = frozenset({502, 503, 504})

_MAX_TXN_OPS: Final = 64
"""Reads batched into one transaction (etcd allows 128 operations by default)."""


@final
class RequestBody(httpx.AsyncByteStream):
    """A request's bytes, sent once per send, that a send cancelled midway leaves nothing of:
    httpx's own body is an async generator, which a cancelled send leaves suspended for the
    garbage collector to finalize (and trio to warn about)."""

    __slots__ = ("_data", "_unsent")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._unsent: bytes | None = None

    def __aiter__(self) -> RequestBody:
        self._unsent = self._data
        return self

    async def __anext__(self) -> bytes:
        data, self._unsent = self._unsent, None
        if data is None:
            raise StopAsyncIteration
        return data


class EtcdError(DiscoveryError):
    """etcd answered with an error; ``code`` is its gRPC status (0 if none)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# Answers, with only the fields this package reads (requests are plain dicts).
class _Header(msgspec.Struct, frozen=True):
    revision: int = 0


class KeyValue(msgspec.Struct, frozen=True):
    """One stored key (``mvccpb.KeyValue``)."""

    key: bytes = b""
    value: bytes = b""
    mod_revision: int = 0
    lease: int = 0


class _Answer(msgspec.Struct, frozen=True):
    """Any unary answer or error; proto3 omits zero values, so each kind fills only its fields."""

    header: _Header = msgspec.field(default_factory=_Header)
    kvs: list[KeyValue] = msgspec.field(default_factory=list)
    succeeded: bool = False
    responses: list[_TxnOp] = msgspec.field(default_factory=list)
    ID: int = 0
    TTL: int = 0
    result: _Answer | None = None  # a keepalive's answer is wrapped in "result"
    error: str = ""
    message: str = ""
    code: int = 0


class _TxnOp(msgspec.Struct, frozen=True):
    response_range: _Answer = msgspec.field(default_factory=_Answer)


class WatchEventMessage(msgspec.Struct, frozen=True):
    """One event of a watch response (``mvccpb.Event``)."""

    type: Literal["PUT", "DELETE"] = "PUT"
    kv: KeyValue = msgspec.field(default_factory=KeyValue)


class WatchResult(msgspec.Struct, frozen=True):
    """One watch response (``etcdserverpb.WatchResponse``)."""

    header: _Header = msgspec.field(default_factory=_Header)
    created: bool = False
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""
    events: list[WatchEventMessage] = msgspec.field(default_factory=list)


class WatchMessage(msgspec.Struct, frozen=True):
    """One line of the ``/v3/watch`` stream: a result, or the gateway's error."""

    result: WatchResult | None = None
    error: _Answer | None = None


_encoder = msgspec.json.Encoder()
_JSON: Final = {"content-type": "application/json"}
_answer_decoder = msgspec.json.Decoder(_Answer, strict=False)


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """``(key, range_end)`` selecting every key under ``prefix`` (empty: the whole keyspace)."""
    key = prefix.encode()
    end = key.rstrip(b"\xff")
    if not end:
        return (key or b"\0"), b"\0"
    return key, end[:-1] + bytes([end[-1] + 1])


@final
class EtcdGateway:
    """Typed calls to the gateways of ``endpoints``, with failover (the caller owns ``client``)."""

    def __init__(
        self, client: httpx.AsyncClient, endpoints: Sequence[str], *, timeout: float
    ) -> None:
        self._client, self._timeout = client, timeout
        self._endpoints = tuple(url.rstrip("/") for url in endpoints)
        self._current = 0
        self._moved = trio.Event()

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the one that last answered)."""
        return self._endpoints[self._current]

    async def wait_moved_from(self, endpoint: str) -> None:
        """Return once requests no longer go to ``endpoint`` (some request failed over)."""
        while self.endpoint == endpoint:
            await self._moved.wait()

    async def range_prefix(self, prefix: str) -> tuple[dict[str, bytes], int]:
        """Every key under ``prefix`` (non-UTF-8 ones logged and skipped) and its revision."""
        key, range_end = prefix_range(prefix)
        response = await self._call("/v3/kv/range", {"key": key, "range_end": range_end})
        kvs = {name: kv.value for kv in response.kvs if (name := decode_key(kv.key)) is not None}
        return kvs, response.header.revision

    async def get_keys(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        """The stored key-value of each of ``keys`` that exists (batched in transactions)."""
        found: dict[str, KeyValue] = {}
        for start in range(0, len(keys), _MAX_TXN_OPS):
            batch = keys[start : start + _MAX_TXN_OPS]
            ops = [{"request_range": {"key": key.encode()}} for key in batch]
            response = await self._call("/v3/kv/txn", {"success": ops})
            if not response.succeeded or len(response.responses) != len(batch):
                raise DiscoveryError(f"etcd answered a read of {len(batch)} keys with {response}")
            for key, op in zip(batch, response.responses, strict=True):
                found.update((key, kv) for kv in op.response_range.kvs if kv.key == key.encode())
        return found

    async def put(self, key: str, value: bytes, lease_id: int) -> None:
        request = {"key": key.encode(), "value": value, "lease": str(lease_id)}
        await self._call("/v3/kv/put", request)

    async def delete(self, key: str) -> None:
        """Delete ``key`` (absent is fine)."""
        await self._call("/v3/kv/deleterange", {"key": key.encode()})

    async def grant(self, ttl: int, lease_id: int = 0) -> tuple[int, int]:
        """Create a lease (``lease_id`` 0: etcd picks); ``(id, ttl)``, etcd may raise the ttl."""
        response = await self._call("/v3/lease/grant", {"TTL": str(ttl), "ID": str(lease_id)})
        if response.error or response.ID <= 0 or response.TTL <= 0:
            raise EtcdError(f"etcd refused the lease: {response.error or response}", 0)
        return response.ID, response.TTL

    async def keepalive(self, lease_id: int) -> int:
        """Refresh a lease once; returns its remaining TTL (0 or less: the lease is gone)."""
        response = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)})
        return response.result.TTL if response.result else 0

    async def revoke(self, lease_id: int) -> None:
        """End a lease now; every key attached to it is deleted in one revision."""
        await self._call("/v3/lease/revoke", {"ID": str(lease_id)})

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncIterator[tuple[str, AsyncIterator[str]]]:
        """Yield ``(endpoint, lines)`` of a watch of ``prefix``; leaving closes the connection."""
        key, range_end = prefix_range(prefix)
        create = {"key": key, "range_end": range_end, "start_revision": str(start_revision)}
        timeouts = httpx.Timeout(self._timeout, read=None)
        endpoint, response = await self._send(
            "/v3/watch", {"create_request": create}, timeouts=timeouts, stream=True
        )
        # aiter_lines() is an async generator (typed as a plain iterator):
        # close it here, not whenever the garbage collector gets to it.
        lines = cast("AsyncGenerator[str, None]", response.aiter_lines())
        try:
            async with aclosing(lines):
                yield endpoint, lines
        finally:
            with trio.move_on_after(self._timeout, shield=True):
                await response.aclose()

    async def _call(self, path: str, request: object) -> _Answer:
        _, response = await self._send(path, request, timeouts=self._timeout)
        try:
            return _answer_decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise DiscoveryError(f"etcd sent an unreadable answer to {path}: {exc}") from None

    async def _send(
        self, path: str, request: object, *, timeouts: float | httpx.Timeout, stream: bool = False
    ) -> tuple[str, httpx.Response]:
        """Send to the current endpoint, failing over to the next ones; return the endpoint
        that answered and its 200 response (open if ``stream``: the caller closes it).
        :class:`EtcdError` for an error another endpoint would not fix."""
        content = _encoder.encode(request)
        failures: list[str] = []
        for _ in range(len(self._endpoints)):
            endpoint = self._endpoints[self._current]
            http_request = self._client.build_request(
                "POST", endpoint + path, content=content, headers=_JSON, timeout=timeouts
            )
            http_request.stream = RequestBody(content)
            try:
                response = await self._client.send(http_request, stream=stream)
                if response.status_code == httpx.codes.OK:
                    return endpoint, response
                try:
                    await response.aread()  # error bodies are small
                finally:
                    await response.aclose()
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {_message(exc)}"
            else:
                error = _error_from(response, path)
                # Another endpoint might answer: this member is down, has no leader, ...
                unavailable = response.status_code in _FAILOVER_HTTP_STATUS
                if not unavailable and error.code != GRPC_UNAVAILABLE:
                    raise error
                reason = str(error)
            failures.append(f"{endpoint}: {reason}")
            if len(self._endpoints) > 1:
                self._current = (self._current + 1) % len(self._endpoints)
                self._moved.set()
                self._moved = trio.Event()
                logger.warning(
                    "discovery: etcd %s failed (%s); trying %s", endpoint, reason, self.endpoint
                )
        raise DiscoveryError(f"no etcd endpoint answered {path}: {'; '.join(failures)}")


def decode_key(raw: bytes) -> str | None:
    """A key as ``str``, or ``None`` (logged) if it is not UTF-8."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        logger.warning("discovery: skipping non-UTF-8 etcd key %r", raw)
        return None


def _error_from(response: httpx.Response, path: str) -> EtcdError:
    """The error an etcd error answer stands for (its body may be anything)."""
    try:
        body = _answer_decoder.decode(response.content)
    except msgspec.DecodeError:
        body = _Answer()
    fallback = f"HTTP {response.status_code} {response.content[:200]!r}"
    return EtcdError(f"etcd {path}: {body.message or body.error or fallback}", body.code)


def _message(exc: BaseException) -> str:
    """``exc``'s message, else the first in its causes (httpx's TLS failures have none)."""
    cause: BaseException | None = exc
    for _ in range(8):  # a bounded walk: a chain of causes may loop
        if cause is None or str(cause):
            break
        cause = cause.__cause__ or cause.__context__
    return "" if cause is None else str(cause)
