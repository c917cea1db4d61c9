"""The ``etcd`` backend: a real etcd v3 cluster, through its JSON gateway.

A lost lease is re-granted with the same id and lost keys are re-put after each
keepalive, so an instance keeps its identity through etcd restarts; timeouts
follow the lease TTL (docs/discovery.md, "The etcd backend").
"""

from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, final

import httpx
import trio

from ._base import CLOSE_TIMEOUT, Discovery, DiscoveryError, check_key
from ._etcd_gateway import GRPC_ALREADY_EXISTS, GRPC_NOT_FOUND, EtcdError, EtcdGateway
from ._etcd_watch import WatchPump
from ._watch import WATCH_BUFFER, Watch, WatchEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._config import DiscoveryConfig

logger = logging.getLogger(__name__)

_REQUEST_TIMEOUT: Final = 5.0
"""Bounds, in seconds, of one unary request to one endpoint ("Timeouts follow the TTL")."""
_MIN_REQUEST_TIMEOUT: Final = 0.5


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
        self._requested_ttl = max(1, math.ceil(config.lease_ttl))
        self._ttl = self._requested_ttl
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
        state, _ = await self._gateway.range_prefix(prefix)
        return state

    @asynccontextmanager
    async def watch_prefix(self, prefix: str) -> AsyncIterator[Watch]:
        check_key(prefix)
        gateway = self._gateway
        initial, revision = await gateway.range_prefix(prefix)
        send_channel, receive_channel = trio.open_memory_channel[WatchEvent](WATCH_BUFFER)
        pump = WatchPump(gateway, prefix, dict(initial), revision + 1, send_channel)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.run)
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
        gateway = self._gateway_or_none
        if gateway is None:
            return
        try:
            await gateway.revoke(self._lease_id)
        except EtcdError as exc:
            if not _lease_gone(exc):
                logger.warning("discovery: cannot revoke lease %x: %s", self._lease_id, exc)
        except DiscoveryError as exc:
            logger.warning(
                "discovery: cannot revoke lease %x (it expires in %ds): %s",
                self._lease_id,
                self._ttl,
                exc,
            )
