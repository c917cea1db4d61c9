"""HTTP to an ASGI app over memory streams: hypercorn's protocols (the edge's
:func:`~dynamo_trio.edge.serve_stream`) on one end, httpx or raw bytes on the other.

No socket, no port: a test runs in one trio run, on the autojump clock when it
waits (``autojump_clock``), and each of its connections is served in its nursery.
"""

from __future__ import annotations

import ssl
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import httpcore
import httpcore2
import httpx
import httpx2
import pytest
import trio
import trio.testing
from hypercorn.config import Config as HypercornConfig

from dynamo_trio.edge import serve_stream

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_Pair = trio.StapledStream[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]

URL = "http://edge.test"
"""Any URL will do: every connection reaches the same app."""

TLS: Final = ssl.create_default_context()
"""The one TLS context of every client made here: an httpx client otherwise loads the
system's CA bundle afresh, most of what making one costs."""

_SERVED: dict[str, MemoryHTTP] = {}
"""The networks :func:`serve_memory` serves, by URL, while they serve."""


def hypercorn_config(**settings: Any) -> HypercornConfig:
    """hypercorn's defaults without an access log, with ``settings`` (its attributes)."""
    config = HypercornConfig()
    config.accesslog = None
    for name, value in settings.items():
        setattr(config, name, value)
    return config


@final
class MemoryHTTP(httpcore.AsyncNetworkBackend):
    """A network on which every connection reaches ``app``, served in ``nursery`` by
    ``serve_stream(app, config, stream, **options)``."""

    def __init__(
        self,
        nursery: trio.Nursery,
        app: Any,
        config: HypercornConfig | None = None,
        **options: Any,
    ) -> None:
        self.nursery = nursery
        self._serve = partial(serve_stream, app, config or hypercorn_config(), **options)
        self.connections = 0
        """How many connections were made (by clients or :meth:`connect`)."""

    async def connect(self) -> _Pair:
        """A new connection's client end, for a test that speaks raw bytes."""
        await trio.lowlevel.checkpoint()
        client, server = trio.testing.memory_stream_pair()
        self.connections += 1
        self.nursery.start_soon(self._serve, server)
        return client

    def client(self, *, http2: bool = False, **options: Any) -> httpx.AsyncClient:
        """An httpx client whose connections are this network's (``options``: the client's)."""
        transport = httpx.AsyncHTTPTransport(verify=TLS, http1=not http2, http2=http2)
        transport._pool = httpcore.AsyncConnectionPool(
            network_backend=self, http1=not http2, http2=http2
        )
        return httpx.AsyncClient(transport=transport, base_url=URL, **options)

    def sdk_client(self) -> httpx2.AsyncClient:
        """An httpx2 client (what the openai and anthropic SDKs take) on this network."""
        transport = httpx2.AsyncHTTPTransport(verify=TLS)
        transport._pool = httpcore2.AsyncConnectionPool(network_backend=_Backend2(self))
        return httpx2.AsyncClient(transport=transport)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _ClientEnd(await self.connect())

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a memory network has no Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


async def serve_memory(
    nursery: trio.Nursery,
    app: Any,
    config: HypercornConfig | None = None,
    **options: Any,
) -> str:
    """``app`` served in ``nursery`` on a network of its own; a URL that
    :func:`http_client` reaches it at (until the nursery ends)."""
    network = MemoryHTTP(nursery, app, config, **options)
    url = f"http://memory-{id(network):x}.test"

    async def registered(*, task_status: trio.TaskStatus[None]) -> None:
        _SERVED[url] = network
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            del _SERVED[url]

    await nursery.start(registered)
    return url


def sdk_http_client(url: str) -> httpx2.AsyncClient | None:
    """The ``http_client`` an openai or anthropic SDK client needs to reach ``url``: the
    memory network's, or ``None`` (the SDK's own) for any other URL."""
    network = _SERVED.get(url)
    return None if network is None else network.sdk_client()


# The official clients (openai, anthropic) stop reading a stream at ``data: [DONE]`` (or an
# error event) by breaking out of, or raising through, their own chain of event generators
# (``openai._streaming.AsyncStream.__stream__``) without closing them, so even a stream read
# to its end leaves that chain (openai or anthropic, httpx2, httpcore2) to the garbage
# collector.  Those generators, by name, and nothing else.
_SDK_GENERATORS = "|".join(
    (
        r"AsyncStream\.(_iter_events|__stream__)",
        r"SSEDecoder\.(aiter_bytes|_aiter_chunks)",  # (the second: anthropic's decoder)
        r"async_iter_response_bytes",  # (anthropic's)
        r"Response\.aiter_(bytes|raw|text|lines)",
        r"(BoundAsyncStream|AsyncResponseStream|PoolByteStream|HTTP11ConnectionByteStream)\.__aiter__",
        r"AsyncHTTP11Connection\._receive_response_body",
    )
)
_Test = TypeVar("_Test", bound="Callable[..., object]")


def openai_client_leaves_generators(test: _Test) -> _Test:
    """Marks a test whose official clients leave generators to the garbage collector: the
    test ignores their finalization, and collects them before it ends (else whichever test
    the collector next runs in, in the same process, would meet them)."""
    ignore = pytest.mark.filterwarnings(
        rf"ignore:Exception ignored in. <async_generator object ({_SDK_GENERATORS}) at"
        r":pytest.PytestUnraisableExceptionWarning"
    )
    marked: _Test = pytest.mark.usefixtures("collect_garbage_at_exit")(ignore(test))
    return marked


def http_client(url: str, **options: Any) -> httpx.AsyncClient:
    """An httpx client with ``base_url=url``: over the memory network :func:`serve_memory`
    gave ``url``, or over TCP for any other URL (``options``: the client's)."""
    network = _SERVED.get(url)
    if network is None:
        return httpx.AsyncClient(base_url=url, **{"verify": TLS, **options})
    client = network.client(**options)
    client.base_url = httpx.URL(url)
    return client


async def open_connection(url: str) -> trio.abc.HalfCloseableStream:
    """A new raw connection to ``url`` (memory or TCP), for a test that speaks bytes."""
    network = _SERVED.get(url)
    if network is not None:
        return await network.connect()
    parts = httpx.URL(url)
    return await trio.open_tcp_stream(parts.host, parts.port or 80)


class _End:
    """A connection's client end as httpcore sees a socket (its errors and timeouts)."""

    _errors: Any  # httpcore or httpcore2: whose exceptions to raise

    def __init__(self, stream: _Pair) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        try:
            with trio.fail_after(float("inf") if timeout is None else timeout):
                return bytes(await self._stream.receive_some(max_bytes))
        except trio.TooSlowError as exc:
            raise self._errors.ReadTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self._errors.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        try:
            with trio.fail_after(float("inf") if timeout is None else timeout):
                await self._stream.send_all(buffer)
        except trio.TooSlowError as exc:
            raise self._errors.WriteTimeout(str(exc)) from exc
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self._errors.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
    ) -> Any:
        raise self._errors.ConnectError("the memory network speaks plain HTTP")

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # how httpcore finds a pooled connection the server closed
            incoming = self._stream.receive_stream._incoming
            return bool(incoming._data) or incoming._closed
        return None


@final
class _ClientEnd(_End, httpcore.AsyncNetworkStream):
    _errors = httpcore


@final
class _ClientEnd2(_End, httpcore2.AsyncNetworkStream):
    _errors = httpcore2


@final
class _Backend2(httpcore2.AsyncNetworkBackend):
    """A :class:`MemoryHTTP` as httpcore2 (the SDK clients') sees a network."""

    def __init__(self, network: MemoryHTTP) -> None:
        self._network = network

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return _ClientEnd2(await self._network.connect())

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
