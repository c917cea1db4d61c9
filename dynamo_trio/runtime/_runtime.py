"""``DistributedRuntime``: one per process; owns discovery, the request plane and metrics."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import socket
import warnings
from contextlib import AsyncExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, Self, final

import trio
from prometheus_client import CollectorRegistry

from .._config import Config
from .._contain import collapse, is_cancellation, split_live_cancellation
from .._context import CancelReason, Context
from .._errors import (
    Cancelled,
    CannotConnect,
    Disconnected,
    DynamoError,
    EngineShutdown,
    InvalidArgument,
    error_from_exception,
)
from .._gc import tune_gc
from .._hostport import host_port
from .._lifeline import parent_gone, take_lifeline
from .._logcontext import LOG_FORMAT, RequestLogFilter, bind_request
from .._ratelimit import LogLimiter
from .._signals import shut_down_on_signals
from .._tracing import read_request_headers
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
from ._client import Annotated, Client
from ._router import Router

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Iterator
    from types import TracebackType

    from ..discovery import Discovery, MemoryStore, ModelType, PrefixView
    from ..metrics import EndpointMetrics, RequestTracker
    from ..request_plane import ClientStream, ServerStream

_log = logging.getLogger("dynamo_trio.runtime")
_bugs: Final = LogLimiter(_log, interval=60.0, burst=1)

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
        self._endpoints: dict[str, _Served] = {}
        self._registrations: dict[str, bytes] = {}
        self._clients: dict[str, Client] = {}
        self.router: Final = Router(self._connect, self._require_nursery)
        """Which instance each call goes to (for every client and the frontend)."""
        self._inflight: set[Context] = set()
        self._idle: trio.Event | None = None  # set when the last request in flight ends
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
        self._kill_all()
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
        """Run the handler for ``stream`` contained; end the stream, and count it, exactly once."""
        endpoint = self._endpoints.get(stream.endpoint)
        if endpoint is None or stream.instance_id != self.instance_id:
            message = f"instance {self.instance_id:x} does not serve {stream.endpoint}"
            stream.fail(CannotConnect(f"{message} (asked for instance {stream.instance_id:x})"))
            return
        context = stream.context
        trace, metadata = read_request_headers(stream.headers)
        context._set_trace(trace)
        if metadata:
            context.metadata = metadata
        context.attributes.update(endpoint=endpoint.path, peer=stream.peer)
        tracker = endpoint.metrics.start_request()
        if stream.cancel_signal is not None:
            tracker.cancelled(stream.cancel_signal.value)
        stream.on_cancel_signal = lambda reason: tracker.cancelled(reason.value)
        error: DynamoError | None = None
        grace = self.config.worker.drain_grace
        with self.track(context), bind_request(context):  # log lines name it and its trace
            try:  # contain(), written out; the stream's task nursery hosts the watcher
                await context.run(
                    _relay, stream, endpoint, drain_grace=grace, watchers=stream.task_nursery
                )
            except BaseException as exc:
                cancelled, escaped = split_live_cancellation(exc)
                if escaped is not None:
                    error = _outcome_of(escaped, context, endpoint.path, self.shutdown)
                if cancelled is not None:
                    raise cancelled from None
            finally:
                _finish(stream, context, tracker, error)

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
            for context in tuple(self._inflight):
                served = self._endpoints.get(context.attributes.get("endpoint", ""))
                if served is not None and not served.graceful_shutdown:
                    context.kill(CancelReason.SHUTDOWN)
                else:
                    context.stop(CancelReason.SHUTDOWN)
            await self._wait_idle(grace)
            if self._inflight:
                _log.warning(
                    "killing %d request(s) still running after the %.1fs shutdown grace",
                    len(self._inflight),
                    grace,
                )
                self._kill_all()
                await self._wait_idle(_KILL_SETTLE_TIMEOUT)
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

    @contextmanager
    def track(self, context: Context) -> Iterator[Context]:
        """Count ``context`` as in flight (listed on ``/debug/requests``) for the block."""
        self._inflight.add(context)
        try:
            yield context
        finally:
            self._inflight.discard(context)
            if not self._inflight and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def _wait_idle(self, seconds: float = math.inf) -> None:
        with trio.move_on_after(seconds):
            while self._inflight:
                if self._idle is None:
                    self._idle = trio.Event()
                await self._idle.wait()

    def _kill_all(self) -> None:
        for context in tuple(self._inflight):
            context.kill(CancelReason.SHUTDOWN)

    def inflight(self) -> list[dict[str, Any]]:
        """Each in-flight request as a tree (``Context.snapshot()``), oldest first."""
        return [c.snapshot() for c in sorted(self._inflight, key=lambda c: c.created_at)]

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
        self._names: Final = (self.namespace, self.component, name)
        self.path: Final = "/".join(self._names)

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
        if not callable(handler):
            raise TypeError(f"the handler for {self.path} is not callable: {handler!r}")
        try:  # Dynamo's rule: pass ``context=`` iff the handler has a ``context`` parameter
            wants_context = "context" in inspect.signature(handler).parameters
        except (TypeError, ValueError):
            wants_context = False
        instance_id, labels = runtime.instance_id, metrics_labels or ()
        metrics = runtime.metrics.endpoint(
            *self._names, worker_id=f"{instance_id:x}", labels=labels
        )
        served = _Served(self.path, handler, metrics, wants_context, graceful_shutdown)
        address = await runtime._ensure_server()
        runtime._endpoints[self.path] = served
        instance = Instance(*self._names, instance_id, address)
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
        if model_type == "tensor" and tensor_model_config is None:
            raise ValueError("a tensor model needs its tensor_model_config")
        tensor = tensor_model_config
        config = None if tensor is None else TensorModelConfig.from_dict(tensor)
        head = (name, model_type, *self._names, self.runtime.instance_id)
        card = ModelCard(*head, context_length, max_output_tokens, accepts_continuation, config)
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


class _Served(NamedTuple):
    """An endpoint this process serves: the handler, how to call it, its metrics."""

    path: str
    handler: Callable[..., Any]
    metrics: EndpointMetrics
    wants_context: bool
    graceful_shutdown: bool  # else a shutdown kills its requests


def _outcome_of(
    exc: BaseException, context: Context, path: str, on_exit_request: Callable[[], None]
) -> DynamoError | None:
    """The error a handler's exception ends its stream with; ``None`` for a clean end."""
    exc = collapse(exc) or exc
    if isinstance(exc, Disconnected):
        return None  # the connection is gone; the context was killed as "transport lost"
    request, name = f"request {context.id()} on {path}", type(exc).__name__
    if is_cancellation(exc) or isinstance(exc, _StaleCancelled):
        if context.is_stopped():
            return None  # cancelled as asked: the stream ends stopped/killed, counted once
        _log.info("%s: the handler cancelled itself", request)
        caused_by = "Cancelled" if isinstance(exc, _StaleCancelled) else name
        return Cancelled("the handler cancelled the request", caused_by=caused_by)
    if isinstance(exc, Cancelled) and context.is_stopped():
        return None  # Dynamo's convention: raising Cancelled after a stop is a clean end
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        _log.warning(
            "%s: the handler raised %s; shutting the worker down gracefully", request, name
        )
        on_exit_request()
        return EngineShutdown("the worker is shutting down", caused_by=name)
    error = error_from_exception(exc)
    if isinstance(exc, DynamoError) or isinstance(error, InvalidArgument):
        _log.info("%s failed: %s", request, error)
    else:  # a handler's own failure: one traceback per endpoint and type per interval
        _bugs.error(f"{path} {name}", "%s failed: %s", request, error, exc_info=exc)
    return error


def _finish(
    stream: ServerStream, context: Context, tracker: RequestTracker, error: DynamoError | None
) -> None:
    """Send the one terminal frame and record the one metrics outcome."""
    if error is not None:
        stream.fail(error)
        tracker.finish("error", error_type=error.error_type)
    elif context.is_killed():
        if stream.cancel_signal is CancelReason.SHUTDOWN:
            stream.fail(
                EngineShutdown(f"the worker shut down during the request ({context.reason})")
            )
        else:
            stream.end("killed", context.reason)
        tracker.finish("killed")
    elif context.is_stopped():
        stream.end("stopped", context.reason)
        # A handler that stopped its own context ended on purpose: not a cancellation.
        tracker.finish("stopped" if stream.cancel_signal is not None else "complete")
    else:
        stream.end("complete")
        tracker.finish("complete")


class _StaleCancelled(Exception):
    """A handler's stale trio.Cancelled, carried past the context's nursery (which absorbs it)."""


async def _relay(stream: ServerStream, endpoint: _Served) -> None:
    """The handler's items onto the stream (inside the context's scope)."""
    request, handler, context = stream.payload, endpoint.handler, stream.context
    generator = handler(request, context=context) if endpoint.wants_context else handler(request)
    if not hasattr(generator, "__anext__"):
        if inspect.iscoroutine(generator):
            generator.close()
        raise TypeError(
            f"the handler for {endpoint.path} must be an async generator "
            f"(it returned {type(generator).__name__})"
        )
    try:
        async for item in generator:
            if isinstance(item, Annotated):
                await stream.send_item(
                    item.data(), id=item.id, event=item.event, comment=item.comment
                )
            else:
                await stream.send_item(item)
    except trio.Cancelled as exc:
        if trio.current_effective_deadline() == -math.inf:
            raise  # a live cancellation: the context's kill, or a scope around it
        raise _StaleCancelled(str(exc)) from exc
    finally:
        aclose = getattr(generator, "aclose", None)
        if aclose is not None:
            await aclose()
