"""The request plane over memory streams: a :class:`~dynamo_trio.runtime.Transport`
shared by the runtimes of one test (``DistributedRuntime(transport=...)``).

Each runtime that serves gets an address of its own; a connection to it is a
``trio.testing.memory_stream_pair`` handed to its server, as an accepted socket
would be.  No socket, no port: the test can run on the autojump clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import trio
import trio.testing

if TYPE_CHECKING:
    from dynamo_trio.request_plane import RequestPlaneServer


@final
class MemoryTransport:
    """Addresses ``127.0.0.1:1``, ``:2``, ... each served by one runtime's server."""

    def __init__(self) -> None:
        self._servers: dict[str, tuple[RequestPlaneServer, trio.Nursery]] = {}
        self._ports = 0
        self.opened: dict[str, int] = {}
        """Connections made, by address."""

    async def open(self, address: str) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        found = self._servers.get(address)
        if found is None or found[0].draining:  # no listener, or it stopped accepting
            raise OSError(f"connection refused: {address}")
        server, nursery = found
        self.opened[address] = self.opened.get(address, 0) + 1
        client, accepted = trio.testing.memory_stream_pair()
        nursery.start_soon(server.handle_connection, accepted, "127.0.0.1:0")
        return client

    async def listen(
        self, server: RequestPlaneServer, *, task_status: trio.TaskStatus[tuple[str, int]]
    ) -> None:
        self._ports += 1
        address = f"127.0.0.1:{self._ports}"
        async with trio.open_nursery() as nursery:
            self._servers[address] = (server, nursery)
            try:
                task_status.started(("127.0.0.1", self._ports))
                await trio.sleep_forever()
            finally:
                del self._servers[address]
