"""``DistributedRuntime``: one per process; owns discovery, the request plane and metrics."""

from __future__ import annotations

import functools
import logging
import os
import socket
import warnings
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, final

import trio
from prometheus_client import CollectorRegistry

from .._config import Config
from .._context import CancelReason, Context
from .._errors import CannotConnect
from .._gc import tune_gc
from .._hostport import host_port
from .._lifeline import parent_gone, take_lifeline
from .._logcontext import LOG_FORMAT, RequestLogFilter
from .._signals import shut_down_on_signals
from ..discovery import (
    Instance,
    ModelCard,
    TensorModelConfig,
    decode_instance,
    encode_record,
    instance_prefix,
    open_discovery,
    view_prefix,
)
from ..metrics import StatusReport, WorkerMetrics, serve_status
from ..request_plane import ClientConnection, ConnectionPool, RequestPlaneServer
from ._client import Client
from ._router import Router
from ._serve import InflightRequests, ServedEndpoint, serve_stream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable
    from contextlib import AbstractContextManager
    from types import TracebackType

    from ..discovery import Discovery, MemoryStore, ModelType, PrefixView
    from ..request_plane import ClientStream, ServerStream

_log = logging.getLogger("dynamo_trio.runtime")

_DEREGISTER_TIMEOUT: Final = 2.0
_KILL_SETTLE_TIMEOUT: Final = 5.0
_NOT_OPEN: Final = "the runtime is not open: use 'async with DistributedRuntime()'"


class Transport(Protocol):
    """Where a runtime's request plane listens and how it reaches others (default TCP)."""

    async def open(self, address: str) -> trio.abc.Stream:
        """A new connection to the server at ``address`` (``host:port``)."""

    async def listen(
        self, server: RequestPlaneServer, *, task_status: trio.TaskStatus[tuple[str, int]]
    ) -> None:
        """Hand ``server.handle_connection`` each connection to a new address until
        cancelled, refusing them once it is ``draining``; ``started((host, port))``."""


@final
class DistributedRuntime:
    """The per-process runtime, used as ``async with DistributedRuntime(config) as runtime``;
    leaving the block leaves no task, socket or registration behind.  ``config`` defaults to
    ``Config.from_env()``; ``memory_store`` is the ``mem`` discovery store to share within the
    process; ``transport`` replaces the request plane's TCP."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        registry: CollectorRegistry | None = None,
        memory_store: MemoryStore | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.config: Final = config if config is not None else Config.from_env()
        self.registry: Final = registry if registry is not None else CollectorRegistry()
        self.metrics: Final = WorkerMetrics(self.registry)
        self.name: Final = f"{socket.gethostname()}:{os.getpid()}"
        self._memory_store = memory_store
        self._transport = transport
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._discovery: Discovery | None = None
        self._server: RequestPlaneServer | None = None
        self._server_address: str | None = None
        self._server_lock = trio.Lock()
        self._connection_pool: ConnectionPool | None = None
        self._endpoints: dict[str, ServedEndpoint] = {}
        self._registrations: dict[str, bytes] = {}
        self._clients: dict[str, Client] = {}
        self.router: Final = Router(self._connect, self._require_nursery)
        """Which instance each call goes to (for every client and the frontend)."""
        self._inflight = InflightRequests()
        self._shutdown_requested = trio.Event()
        self._shutdown_done = trio.Event()
        self._status_url: str | None = None
        self._status_stop = trio.Event()

    async def __aenter__(self) -> Self:
        # Not ``async with``: it could swallow a start-up failure (a cancelled nursery).
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            self._discovery = await stack.enter_async_context(
                open_discovery(self.config.discovery, memory_store=self._memory_store)
            )
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            self._nursery.start_soon(self._shutdown_when_requested)
            if self.config.system.port >= 0:
                status = functools.partial(
                    serve_status,
                    self.config.system,
                    self.registry,
                    health=self.health,
                    inflight=self.inflight,
                    shutdown_trigger=self._status_stop.wait,
                )
                self._status_url = await self._nursery.start(status)
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        assert stack is not None
        assert self._nursery is not None
        self._shutdown_requested.set()
        with trio.CancelScope(shield=True):
            await self._deregister_all()
            if exc_type is None:
                await self._finish_calls()
        self._inflight.kill_all(CancelReason.SHUTDOWN)
        if self._server is not None:
            self._server.close_all()
        if self._connection_pool is not None:
            self._connection_pool.close_all()
        self._status_stop.set()
        self._nursery.cancel_scope.cancel()
        await stack.__aexit__(exc_type, exc, tb)

    @property
    def instance_id(self) -> int:
        """This process's instance id (its discovery lease id)."""
        return self.discovery.lease_id

    @property
    def discovery(self) -> Discovery:
        if self._discovery is None:
            raise RuntimeError(_NOT_OPEN)
        return self._discovery

    @property
    def status_url(self) -> str | None:
        """The status server's URL, if ``DYN_SYSTEM_PORT`` turned it on."""
        return self._status_url

    @property
    def address(self) -> str | None:
        """``host:port`` of this process's request-plane server, once it serves."""
        return self._server_address

    @property
    def shutting_down(self) -> bool:
        return self._shutdown_requested.is_set()

    def _require_nursery(self) -> trio.Nursery:
        if self._nursery is None or self._stack is None:
            raise RuntimeError(_NOT_OPEN)
        return self._nursery

    def namespace(self, name: str) -> Namespace:
        """``runtime.namespace("dynamo").component("backend").endpoint("generate")``."""
        return Namespace(self, name)

    def endpoint(self, path: str) -> Endpoint:
        """Dynamo's ``runtime.endpoint("[dyn://]namespace.component.endpoint")``."""
        if not isinstance(path, str):
            raise TypeError(f"an endpoint path is a str, not {type(path).__name__}")
        parts = path.removeprefix("dyn://").split(".")
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"invalid endpoint path {path!r}: expected '[dyn://]namespace.component.endpoint'"
            )
        return self.namespace(parts[0]).component(parts[1]).endpoint(parts[2])

    async def _ensure_server(self) -> str:
        async with self._server_lock:
            if self._server_address is None:
                config = self.config.request_plane
                server = RequestPlaneServer(config, self._handle_stream, name=self.name)
                serve = server.serve
                if self._transport is not None:
                    serve = functools.partial(self._transport.listen, server)
                host, port = await self._require_nursery().start(serve)
                self._server = server
                self._server_address = host_port(config.advertise_host or host, port)
                _log.info("request plane listening on %s:%d", host, port)
            return self._server_address

    async def _handle_stream(self, stream: ServerStream) -> None:
        endpoint = self._endpoints.get(stream.endpoint)
        if endpoint is None or stream.instance_id != self.instance_id:
            stream.fail(
                CannotConnect(
                    f"instance {self.instance_id:x} does not serve "
                    f"{stream.endpoint} (asked for instance {stream.instance_id:x})"
                )
            )
            return
        await serve_stream(
            stream,
            endpoint,
            drain_grace=self.config.worker.drain_grace,
            inflight=self._inflight,
            on_exit_request=self.shutdown,
        )

    async def _register(self, key: str, value: bytes) -> None:
        await self.discovery.put(key, value)
        self._registrations[key] = value

    async def _deregister_all(self) -> None:
        discovery = self._discovery
        registrations, self._registrations = self._registrations, {}
        if discovery is None or discovery.closed:
            return
        with trio.move_on_after(_DEREGISTER_TIMEOUT):
            for key in registrations:
                try:
                    await discovery.delete(key)
                except Exception as exc:
                    _log.warning("could not deregister %s: %s", key, exc)

    def shutdown(self) -> None:
        """Begin a graceful shutdown (synchronous): deregister, send ``goaway``, stop what is in
        flight, kill what is left after ``shutdown_grace`` seconds, close the connections."""
        self._shutdown_requested.set()

    async def wait_shut_down(self) -> None:
        """Return once a graceful shutdown has completed."""
        await self._shutdown_done.wait()

    async def _shutdown_when_requested(self) -> None:
        await self._shutdown_requested.wait()
        try:
            grace = self.config.worker.shutdown_grace
            _log.info(
                "shutting down: deregistering, refusing new requests, draining %d in-flight "
                "request(s) for up to %.1fs",
                len(self._inflight),
                grace,
            )
            await self._deregister_all()
            server = self._server
            if server is not None:
                server.go_away()
                server.stop_accepting()
            for context in self._inflight:
                served = self._endpoints.get(context.attributes.get("endpoint", ""))
                if served is not None and not served.graceful_shutdown:
                    context.kill(CancelReason.SHUTDOWN)
                else:
                    context.stop(CancelReason.SHUTDOWN)
            with trio.move_on_after(grace):
                await self._inflight.wait_empty()
            if self._inflight:
                _log.warning(
                    "killing %d request(s) still running after the %.1fs shutdown grace",
                    len(self._inflight),
                    grace,
                )
                self._inflight.kill_all(CancelReason.SHUTDOWN)
                with trio.move_on_after(_KILL_SETTLE_TIMEOUT):
                    await self._inflight.wait_empty()
            if server is not None:
                server.close_all(graceful=True)
            self._status_stop.set()
        finally:
            self._shutdown_done.set()

    async def _finish_calls(self) -> None:
        """Kill live calls; give stopped ones the drain grace (closing would kill them)."""
        pool = self._connection_pool
        if pool is None:
            return

        def streams() -> list[ClientStream]:
            return [stream for connection in pool.connections() for stream in connection.streams()]

        for stream in streams():
            if not stream.draining:
                stream.kill(CancelReason.SHUTDOWN)
        with trio.move_on_after(self.config.worker.drain_grace):
            # Bounded; the streams end on frames from the workers.
            while any(stream.draining for stream in streams()):  # noqa: ASYNC110
                await trio.sleep(0.01)

    def _pool(self) -> ConnectionPool:
        if self._connection_pool is None:
            self._connection_pool = ConnectionPool(
                self.config.request_plane,
                self._require_nursery(),
                name=self.name,
                on_connection_lost=self._connection_lost,
                open_transport=None if self._transport is None else self._transport.open,
            )
        return self._connection_pool

    async def _connect(self, address: str) -> ClientConnection:
        return await self._pool().connect(address)

    def _connection_lost(self, address: str, reason: str, drained: bool) -> None:
        if self._stack is None:
            return  # the runtime is closing its own connections
        if drained:
            reason = f"it shut down ({reason})"
        for client in self._clients.values():
            for target, at in client.targets().items():
                if at == address:
                    self.router.failed(target, reason, expected=drained)

    def start_soon(self, task: Callable[[], Awaitable[object]], *, name: str) -> None:
        """Run ``task`` in the runtime's nursery: it lasts at most as long as the runtime."""
        self._require_nursery().start_soon(task, name=name)

    async def watch_prefix(self, prefix: str, decode: Callable[[bytes], Any]) -> PrefixView[Any]:
        """A live view of discovery records under ``prefix``, kept for the runtime's life."""

        async def watch(*, task_status: trio.TaskStatus[PrefixView[Any]]) -> None:
            async with view_prefix(self.discovery, prefix, decode) as view:
                task_status.started(view)
                await trio.sleep_forever()

        view: PrefixView[Any] = await self._require_nursery().start(watch)
        return view

    def track(self, context: Context) -> AbstractContextManager[Context]:
        """Count ``context`` as in flight (listed on ``/debug/requests``) for the block."""
        return self._inflight.track(context)

    def inflight(self) -> list[dict[str, Any]]:
        """Each in-flight request as a tree (``Context.snapshot()``), oldest first."""
        return self._inflight.snapshot()

    def health(self) -> StatusReport:
        """Ready while serving at least one endpoint and not shutting down."""
        ready = not self.shutting_down
        return StatusReport.from_endpoints(dict.fromkeys(self._endpoints, ready))


@final
class Namespace:
    """A namespace of components (Dynamo's first naming level)."""

    def __init__(self, runtime: DistributedRuntime, name: str) -> None:
        _check_name("namespace", name)
        self.runtime: Final = runtime
        self.name: Final = name

    def component(self, name: str) -> Component:
        return Component(self, name)


@final
class Component:
    """A component (a kind of worker) within a namespace."""

    def __init__(self, namespace: Namespace, name: str) -> None:
        _check_name("component", name)
        self.runtime: Final = namespace.runtime
        self.namespace: Final = namespace.name
        self.name: Final = name

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(self, name)


@final
class Endpoint:
    """``namespace/component/endpoint``: what workers serve and clients call."""

    def __init__(self, component: Component, name: str) -> None:
        _check_name("endpoint", name)
        self.runtime: Final = component.runtime
        self.namespace: Final = component.namespace
        self.component: Final = component.name
        self.name: Final = name
        self.path: Final = f"{self.namespace}/{self.component}/{name}"

    def __repr__(self) -> str:
        return f"<Endpoint {self.path}>"

    async def serve_endpoint(
        self,
        handler: Callable[..., Any],
        graceful_shutdown: bool = True,
        metrics_labels: Iterable[tuple[str, str]] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve ``handler(request[, context])`` here until the runtime shuts down;
        ``nursery.start`` returns once registered (at once, registering nothing, if the shutdown
        began first).  ``graceful_shutdown=False``: a shutdown kills this endpoint's requests
        instead of draining them.  ``metrics_labels`` are extra labels on its
        ``dynamo_component_*`` series."""
        runtime = self.runtime
        if runtime.shutting_down:
            task_status.started()
            return
        if self.path in runtime._endpoints:
            raise RuntimeError(f"{self.path} is already served by this process")
        instance_id = runtime.instance_id
        metrics = runtime.metrics.endpoint(
            self.namespace,
            self.component,
            self.name,
            worker_id=f"{instance_id:x}",
            labels=metrics_labels or (),
        )
        served = ServedEndpoint(self.path, handler, metrics, graceful_shutdown=graceful_shutdown)
        address = await runtime._ensure_server()
        runtime._endpoints[self.path] = served
        instance = Instance(
            namespace=self.namespace,
            component=self.component,
            endpoint=self.name,
            instance_id=instance_id,
            address=address,
        )
        await runtime._register(instance.key, encode_record(instance))
        _log.info("serving %s as instance %x at %s", self.path, instance_id, address)
        task_status.started()
        await runtime._shutdown_done.wait()

    def connection_id(self) -> int:
        """This worker's instance id (Dynamo's name; ``worker_id`` labels show it in hex)."""
        return self.runtime.instance_id

    async def client(self) -> Client:
        """A client for this endpoint's instances (shared within the runtime)."""
        runtime = self.runtime
        client = runtime._clients.get(self.path)
        if client is None:
            prefix = instance_prefix(self.namespace, self.component, self.name)
            view: PrefixView[Instance] = await runtime.watch_prefix(prefix, decode_instance)
            client = runtime._clients.setdefault(
                self.path, Client(self.path, view, runtime.router, runtime._connect)
            )
        return client

    async def register_model(
        self,
        name: str,
        model_type: ModelType,
        *,
        context_length: int | None = None,
        max_output_tokens: int | None = None,
        accepts_continuation: bool = False,
        tensor_model_config: dict[str, Any] | None = None,
    ) -> None:
        """Announce that this endpoint (served by this process) serves model ``name``; the
        frontend enforces the token limits and migrates only to handlers that
        ``accepts_continuation``; a ``tensor`` model needs ``tensor_model_config``
        (``{"name", "inputs": [{"name", "data_type", "shape"}], "outputs": [...]}``)."""
        tensor_config = None
        if model_type == "tensor" or tensor_model_config is not None:
            if tensor_model_config is None:
                raise ValueError("a tensor model needs its tensor_model_config")
            tensor_config = TensorModelConfig.from_dict(tensor_model_config)
        card = ModelCard(
            name=name,
            model_type=model_type,
            namespace=self.namespace,
            component=self.component,
            endpoint=self.name,
            instance_id=self.runtime.instance_id,
            context_length=context_length,
            max_output_tokens=max_output_tokens,
            accepts_continuation=accepts_continuation,
            tensor_model_config=tensor_config,
        )
        await self.runtime._register(card.key, encode_record(card))


def _check_name(what: str, name: str) -> None:
    if not name or "/" in name or name.strip() != name:
        raise ValueError(f"invalid {what} name {name!r}: non-empty, no '/' or surrounding spaces")


def dynamo_worker(
    config: Config | None = None, *, handle_signals: bool = True, enable_nats: bool | None = None
) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
    """Decorate ``async def main(runtime, ...)`` so that ``trio.run(main)`` runs it in a runtime;
    SIGINT/SIGTERM start a graceful shutdown (a second one ends the process), and
    ``enable_nats`` is ignored with a ``DeprecationWarning``, as in Dynamo."""
    if enable_nats is not None:
        warnings.warn(
            "dynamo_worker(enable_nats=...) is deprecated (as in Dynamo 1.6.1) and ignored: "
            "dynamo-trio has no NATS",
            DeprecationWarning,
            stacklevel=2,
        )

    def decorate(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> None:
            settings = config if config is not None else Config.from_env()
            configure_logging(settings.log_level)
            tune_gc(settings.gc_threshold)
            async with DistributedRuntime(settings) as runtime, trio.open_nursery() as nursery:
                if handle_signals:
                    nursery.start_soon(shut_down_on_signals, runtime.shutdown)
                fd = take_lifeline()
                if fd is not None:
                    nursery.start_soon(_shutdown_with_supervisor, runtime, fd)
                await fn(runtime, *args, **kwargs)
                nursery.cancel_scope.cancel()

        return wrapper

    return decorate


def configure_logging(level: str, text: str = LOG_FORMAT) -> None:
    """Log to stderr at ``level`` (``DYN_LOG``) in lines that name the request being served,
    unless the application set logging up."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.addFilter(RequestLogFilter())
    handler.setFormatter(logging.Formatter(text))
    root.addHandler(handler)
    root.setLevel(level.upper())
    if level != "debug":  # httpx logs every request (each etcd keepalive) at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)


def configure_dynamo_logging(service_name: str | None = None, worker_id: int | None = None) -> None:
    """Dynamo's ``configure_dynamo_logging``: replace the root handlers with one to stderr,
    prefixing lines ``[service_name:worker_id]`` when given; call it before ``trio.run``."""
    level = Config.from_env().log_level
    prefix = (service_name or "") + ("" if worker_id is None else f":{worker_id}")
    text = LOG_FORMAT.replace("%(message)s", f"[{prefix}] %(message)s") if prefix else LOG_FORMAT
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    configure_logging(level, text)


async def _shutdown_with_supervisor(runtime: DistributedRuntime, fd: int) -> None:
    await parent_gone(fd)
    _log.warning("the process that started this worker is gone: shutting down gracefully")
    runtime.shutdown()
