"""The ``etcd`` backend: a real etcd v3 cluster through its JSON gateway (proto3's JSON mapping:
base64 bytes, 64-bit integers as strings, zero values omitted), failing over between endpoints.
docs/discovery.md, "The etcd backend": the lease keeps its id through etcd restarts; "Watches":
why a watch follows revisions with a reader task and a deliverer task."""

from __future__ import annotations

import logging
import math
from collections import deque
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Final, Literal, cast, final

import httpx
import msgspec
import trio

from ._base import CLOSE_TIMEOUT, Discovery, DiscoveryError, check_key
from ._watch import WATCH_BUFFER, Watch, WatchEvent, diff_events

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Sequence

    from .._config import DiscoveryConfig

logger = logging.getLogger(__name__)

_REQUEST_TIMEOUT: Final = 5.0
"""Bounds, in seconds, of one unary request to one endpoint ("Timeouts follow the TTL")."""
_MIN_REQUEST_TIMEOUT: Final = 0.5
_MIN_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 2.0
_MAX_PENDING: Final = 10_000
"""Events queued for a slow consumer before they are coalesced into a state difference."""

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
_watch_decoder = msgspec.json.Decoder(WatchMessage, strict=False)


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
            tried = self._current
            endpoint = self._endpoints[tried]
            http_request = self._client.build_request(
                "POST", endpoint + path, content=content, headers=_JSON, timeout=timeouts
            )
            http_request.stream = RequestBody(content)
            try:
                # A stream's reads are unbounded, but its head (and an error body) is due
                # like any answer: a member cut off mid-request never sends one.
                with trio.fail_after(self._timeout if stream else math.inf):
                    response = await self._client.send(http_request, stream=stream)
                    if response.status_code == httpx.codes.OK:
                        return endpoint, response
                    try:
                        await response.aread()  # error bodies are small
                    finally:
                        await response.aclose()
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {_message(exc)}"
            except trio.TooSlowError:
                reason = f"no answer within {self._timeout:g}s"
            else:
                error = _error_from(response, path)
                # Another endpoint might answer: this member is down, has no leader, ...
                unavailable = response.status_code in _FAILOVER_HTTP_STATUS
                if not unavailable and error.code != GRPC_UNAVAILABLE:
                    raise error
                reason = str(error)
            failures.append(f"{endpoint}: {reason}")
            # Calls failing together move on once: a second step would skip a live member.
            if len(self._endpoints) > 1 and self._current == tried:
                self._current = (tried + 1) % len(self._endpoints)
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


def _lease_gone(exc: DiscoveryError) -> bool:
    """Whether etcd said the lease (or what it names) does not exist."""
    return isinstance(exc, EtcdError) and exc.code == GRPC_NOT_FOUND


@final
class EtcdDiscovery(Discovery):
    """Discovery in an etcd v3 cluster (``config.etcd_endpoints``)."""

    def __init__(self, config: DiscoveryConfig) -> None:
        super().__init__(config.max_record_size)
        if not config.etcd_endpoints:
            raise ValueError("no etcd endpoint configured")
        self._endpoints = config.etcd_endpoints
        self._ttl = self._requested_ttl = max(1, math.ceil(config.lease_ttl))
        self._lease_lost = False  # re-grant it (same id), then restore the owned keys
        self._gateway_or_none: EtcdGateway | None = None

    @property
    def lease_ttl(self) -> int:
        """The TTL etcd granted, in seconds."""
        return self._ttl

    @property
    def _gateway(self) -> EtcdGateway:
        self._check_open()
        assert self._gateway_or_none is not None  # set before _started
        return self._gateway_or_none

    async def _put(self, key: str, value: bytes) -> None:
        gateway = self._gateway
        try:
            await gateway.put(key, value, self._lease_id)
        except DiscoveryError as exc:
            if not _lease_gone(exc):
                raise
            logger.warning("discovery: lease lost (%s); re-granting it", exc)
            self._lease_lost = True  # recovery restores the owned keys, this one included
            if not await self._recover_locked(gateway):
                raise DiscoveryError(f"lease lost and not recovered yet: {exc}") from exc

    async def _delete(self, key: str) -> None:
        await self._gateway.delete(key)

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        check_key(prefix)
        return (await self._gateway.range_prefix(prefix))[0]

    @asynccontextmanager
    async def watch_prefix(self, prefix: str) -> AsyncIterator[Watch]:
        check_key(prefix)
        gateway = self._gateway
        initial, revision = await gateway.range_prefix(prefix)
        send_channel, receive_channel = trio.open_memory_channel[WatchEvent](WATCH_BUFFER)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(WatchPump(gateway, prefix, initial, revision + 1, send_channel).run)
            try:
                yield Watch(initial, receive_channel)
            finally:
                nursery.cancel_scope.cancel(reason="watch closed")
                receive_channel.close()

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        attempt = min(_REQUEST_TIMEOUT, max(_MIN_REQUEST_TIMEOUT, self._requested_ttl / 3))
        # Plain-HTTP endpoints need no CA bundle, whose loading is most of a client's cost.
        tls = any(endpoint.lower().startswith("https:") for endpoint in self._endpoints)
        client = httpx.AsyncClient(timeout=attempt, trust_env=False, verify=tls)
        try:
            gateway = EtcdGateway(client, self._endpoints, timeout=attempt)
            try:
                self._lease_id, self._ttl = await gateway.grant(self._requested_ttl)
            except DiscoveryError as exc:
                raise DiscoveryError(
                    f"cannot register with etcd at {', '.join(self._endpoints)}: {exc}"
                ) from exc
            self._gateway_or_none = gateway
            async with self._run_while_open(lambda: self._keepalive(gateway)):
                yield
        finally:  # shielded: a cancelled exit still closes every connection
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await client.aclose()

    async def _keepalive(self, gateway: EtcdGateway) -> None:
        """Refresh the lease every TTL/3, then restore it and the owned keys if etcd lost them."""
        due = trio.current_time() + self._ttl / 3
        while True:
            # Due after the last attempt began, so a stalled loop refreshes as soon as it resumes.
            await trio.sleep_until(due)
            due = trio.current_time() + self._ttl / 3
            if self._closed:
                return
            try:
                remaining = await gateway.keepalive(self._lease_id)
            except DiscoveryError as exc:
                logger.warning("discovery: lease keepalive failed: %s", exc)
                continue
            if remaining <= 0:
                logger.warning(
                    "discovery: lease %x expired; re-granting it and re-registering %d keys",
                    self._lease_id,
                    len(self._owned),
                )
                self._lease_lost = True
            async with self._lock:
                await self._recover_locked(gateway)

    async def _recover_locked(self, gateway: EtcdGateway) -> bool:
        """Re-grant the lease if it was lost, then re-put the owned keys etcd lost (lock held);
        whether all are back (failures are logged and left for the next keepalive tick)."""
        if self._closed:
            return False
        regranted = self._lease_lost
        try:
            if regranted:
                try:
                    _, self._ttl = await gateway.grant(self._requested_ttl, self._lease_id)
                except EtcdError as exc:
                    if exc.code != GRPC_ALREADY_EXISTS:  # else it was alive after all
                        raise
                self._lease_lost = False
            stored = await gateway.get_keys(list(self._owned))
            found = {key: (kv.value, kv.lease) for key, kv in stored.items()}
            for key in self._repair(found).rewrite:
                await gateway.put(key, self._owned[key], self._lease_id)
        except DiscoveryError as exc:
            self._lease_lost |= _lease_gone(exc)
            logger.warning("discovery: cannot restore the lease and its keys (will retry): %s", exc)
            return False
        if regranted:
            logger.info(
                "discovery: lease %x recovered with %d keys", self._lease_id, len(self._owned)
            )
        return True

    async def _revoke_lease(self) -> None:
        if (gateway := self._gateway_or_none) is None:
            return  # never started
        try:
            await gateway.revoke(self._lease_id)
        except DiscoveryError as exc:
            if not _lease_gone(exc):  # etcd's refusal, or no answer (the lease then expires)
                expiry = "" if isinstance(exc, EtcdError) else f" (it expires in {self._ttl}s)"
                logger.warning(
                    "discovery: cannot revoke lease %x%s: %s", self._lease_id, expiry, exc
                )


@final
class WatchPump:
    """Feeds every change under ``prefix`` from ``next_revision`` on into ``send_channel``;
    ``state`` is the prefix at ``next_revision - 1`` (the consumer's ``Watch.initial``)."""

    def __init__(
        self,
        gateway: EtcdGateway,
        prefix: str,
        state: dict[str, bytes],
        next_revision: int,
        send_channel: trio.MemorySendChannel[WatchEvent],
    ) -> None:
        self._gateway, self._prefix, self._send_channel = gateway, prefix, send_channel
        self.next_revision = next_revision
        self._latest, self._delivered = dict(state), dict(state)  # the reader's, the deliverer's
        self._stop_reason, self._must_resync, self._progress = "", False, False  # the reader's
        self._queue: deque[WatchEvent] = deque()  # from the reader to the deliverer
        self._overflowed = False
        self._wakeup = trio.Event()

    async def run(self) -> None:
        """Follow the prefix until cancelled (never returns otherwise)."""
        async with self._send_channel, trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver)
            await self._read()

    async def _read(self) -> None:
        backoff = _MIN_BACKOFF
        while True:
            self._progress = False
            try:
                await self._follow()
            except DiscoveryError as exc:
                logger.warning(
                    "discovery: watch of %r interrupted (%s); resuming from revision %d",
                    self._prefix,
                    exc,
                    self.next_revision,
                )
            if self._must_resync:
                try:
                    await self.resync()
                except DiscoveryError as exc:
                    logger.warning("discovery: resync of %r failed: %s", self._prefix, exc)
                else:
                    backoff = _MIN_BACKOFF
                    continue
            if self._progress:
                backoff = _MIN_BACKOFF
            await trio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _follow(self) -> None:
        """Read one watch stream; it only ends by :class:`DiscoveryError` (saying why)."""
        broke: BaseException | None = None
        async with self._gateway.watch(self._prefix, self.next_revision) as (endpoint, lines):
            with trio.CancelScope() as own_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._leave_when_abandoned, endpoint, own_scope)
                    try:
                        async for line in lines:
                            # No await and no raise in here (docs/discovery.md, "Watches").
                            if own_scope.cancel_called or not line.strip():
                                continue
                            result = self._result_of(line)
                            if isinstance(result, str):
                                self._stop_reason = result
                                own_scope.cancel(reason=result)
                            else:
                                self._progress = True
                                self._apply(result)
                    except (httpx.TransportError, httpx.StreamError) as exc:
                        broke = exc
                    nursery.cancel_scope.cancel()
            if broke is not None:
                raise DiscoveryError(f"stream broke: {type(broke).__name__}: {broke}") from broke
            if own_scope.cancel_called:  # dropped on purpose (maybe just as it ended)
                raise DiscoveryError(self._stop_reason)
        raise DiscoveryError("stream ended")

    async def _leave_when_abandoned(self, endpoint: str, own_scope: trio.CancelScope) -> None:
        """Drop the stream once the process's requests have failed over from its endpoint."""
        await self._gateway.wait_moved_from(endpoint)
        self._stop_reason = f"requests failed over from {endpoint} to {self._gateway.endpoint}"
        own_scope.cancel(reason=self._stop_reason)

    def _result_of(self, line: str) -> WatchResult | str:
        """The line's watch result, or why the stream must be dropped."""
        try:
            message = _watch_decoder.decode(line)
        except msgspec.DecodeError as exc:
            return f"etcd sent an unreadable watch message: {exc}"
        if message.error is not None:
            return f"etcd ended the watch: {message.error.message}"
        result = message.result
        if result is None:
            return "etcd sent a watch message without a result"
        if result.compact_revision:
            self._must_resync = True
            return f"history up to revision {result.compact_revision} was compacted"
        if result.created and 0 < result.header.revision < self.next_revision - 1:
            self._must_resync = True
            return (
                f"etcd's revision went back from {self.next_revision - 1} to "
                f"{result.header.revision} (a new cluster?)"
            )
        if result.canceled:
            return f"etcd cancelled the watch: {result.cancel_reason or '?'}"
        return result

    def _apply(self, result: WatchResult) -> None:
        floor = self.next_revision  # all events of one response may share a revision
        for event in result.events:
            revision = event.kv.mod_revision
            if revision < floor or (key := decode_key(event.kv.key)) is None:
                continue
            if event.type == "DELETE":
                if self._latest.pop(key, None) is not None:
                    self._enqueue(WatchEvent("delete", key, None))
            else:
                self._latest[key] = event.kv.value
                self._enqueue(WatchEvent("put", key, event.kv.value))
            self.next_revision = max(self.next_revision, revision + 1)

    async def resync(self) -> None:
        """Read the prefix afresh and queue the differences from ``latest`` (step 4)."""
        fresh, revision = await self._gateway.range_prefix(self._prefix)
        self._must_resync = False
        for event in diff_events(self._latest, fresh):
            self._enqueue(event)
        self._latest = fresh
        self.next_revision = revision + 1

    def _enqueue(self, event: WatchEvent) -> None:
        if len(self._queue) >= _MAX_PENDING:  # (never while overflowed: the queue is empty)
            logger.warning(
                "discovery: watcher of %r is %d events behind; coalescing",
                self._prefix,
                len(self._queue),
            )
            self._queue.clear()
            self._overflowed = True
        elif not self._overflowed:
            self._queue.append(event)
        self._wakeup.set()

    async def _deliver(self) -> None:
        while True:
            if self._overflowed:  # the reader cleared the queue and stopped filling it
                self._overflowed = False
                batch = diff_events(self._delivered, self._latest)
            elif self._queue:
                batch = [self._queue.popleft()]
            else:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            for event in batch:
                await self._send_channel.send(event)
                if event.value is None:
                    self._delivered.pop(event.key, None)
                else:
                    self._delivered[event.key] = event.value
