"""Every limit, timeout and ``DYN_*`` environment variable, in one frozen object.

:class:`Config` is built once per process (``Config.from_env()``), then passed
down; nothing else in the package reads the environment.  Sections group the
settings by the part of the system they govern; ``dataclasses.replace`` makes a
variant (tests shorten timeouts that way).

=================================  ====================================  ===============
setting                            environment variable                  default
=================================  ====================================  ===============
discovery.backend                  DYN_DISCOVERY_BACKEND                 ``file``
discovery.file_kv                  DYN_FILE_KV                           ``$TMPDIR/dynamo_store_kv``
discovery.etcd_endpoints           ETCD_ENDPOINTS (comma separated)      ``http://127.0.0.1:2379``
discovery.lease_ttl                DYN_LEASE_TTL_SECS                    10
discovery.poll_interval            DYN_FILE_KV_POLL_SECS                 0.1
discovery.max_record_size          DYN_DISCOVERY_MAX_RECORD_SIZE         1 MiB
request_plane.host                 DYN_TCP_RPC_HOST                      ``127.0.0.1``
request_plane.port                 DYN_TCP_RPC_PORT                      0 (any free port)
request_plane.advertise_host       DYN_TCP_RPC_ADVERTISE_HOST            the bind host
request_plane.auth_token           DYN_REQUEST_PLANE_TOKEN               none
request_plane.max_frame_size       DYN_TCP_MAX_MESSAGE_SIZE              32 MiB
request_plane.max_streams          DYN_TCP_MAX_STREAMS                   1024 per connection
request_plane.stream_window        DYN_STREAM_WINDOW                     64 items
request_plane.max_write_buffer     DYN_TCP_MAX_WRITE_BUFFER              64 MiB per connection
request_plane.connect_timeout      DYN_TCP_CONNECT_TIMEOUT_SECS          5
request_plane.heartbeat_interval   DYN_HEARTBEAT_INTERVAL_SECS           1
request_plane.heartbeat_timeout    DYN_HEARTBEAT_TIMEOUT_SECS            5
request_plane.max_connections      DYN_TCP_MAX_CONNECTIONS               512 per worker
request_plane.max_handshakes       DYN_TCP_MAX_HANDSHAKES                64 unauthenticated at once
request_plane.handshake_timeout    DYN_TCP_HANDSHAKE_TIMEOUT_SECS        5
request_plane.auth_penalty         DYN_TCP_AUTH_PENALTY_SECS             1 (16 failures per, total)
request_plane.tls                  DYN_TCP_TLS (1/0)                     on if a TLS file is set
request_plane.tls_cert             DYN_TCP_TLS_CERT                      none (PEM chain)
request_plane.tls_key              DYN_TCP_TLS_KEY                       none (PEM key)
request_plane.tls_ca               DYN_TCP_TLS_CA                        system trust store
request_plane.tls_client_auth      DYN_TCP_TLS_CLIENT_AUTH (1/0)         0 (1 = mutual TLS)
request_plane.tls_server_name      DYN_TCP_TLS_SERVER_NAME               the host connected to
worker.drain_grace                 DYN_DRAIN_GRACE_SECS                  5
worker.shutdown_grace              DYN_SHUTDOWN_GRACE_SECS               10
system.port                        DYN_SYSTEM_PORT                       -1 (off)
system.host                        DYN_SYSTEM_HOST                       ``127.0.0.1``
frontend.host                      DYN_HTTP_HOST                         ``127.0.0.1``
frontend.port                      DYN_HTTP_PORT                         8000
frontend.on_disconnect             DYN_ON_DISCONNECT                     ``kill``
frontend.stop_grace                DYN_STOP_GRACE_SECS                   5
frontend.keepalive_interval        DYN_SSE_KEEPALIVE_SECS                15 (0 = off)
frontend.max_body_size             DYN_HTTP_MAX_BODY_SIZE                16 MiB
frontend.idle_timeout              DYN_HTTP_IDLE_TIMEOUT_SECS            30
frontend.body_timeout              DYN_HTTP_BODY_TIMEOUT_SECS            30
frontend.max_header_size           DYN_HTTP_MAX_HEADER_SIZE              16 KiB
frontend.max_json_depth            DYN_HTTP_MAX_JSON_DEPTH               64 (at most 256)
frontend.router_mode               DYN_ROUTER_MODE                       ``round-robin``
frontend.http_workers              DYN_HTTP_WORKERS                      1 (processes on the port)
frontend.migration_limit           DYN_MIGRATION_LIMIT                   0 (no migration)
frontend.backend_stream_timeout    DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS  0 (no bound)
frontend.max_request_timeout       DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS     0 (no maximum)
frontend.dead_client_timeout       DYN_HTTP_DEAD_CLIENT_SECS             10 (0 = off)
frontend.stream_writes_per_pass    DYN_HTTP_STREAM_WRITES_PER_PASS       2 (0 = no limit)
frontend.cleartext_http2           DYN_HTTP_CLEARTEXT_HTTP2 (1/0)        0 (HTTP/1.1 only)
frontend.backlog                   DYN_HTTP_BACKLOG                      the kernel's somaxconn
frontend.http2_max_resets          DYN_HTTP2_MAX_RESETS                  100 per connection
frontend.kserve_grpc_port          DYN_KSERVE_GRPC_PORT                  none (no gRPC server)
log_level                          DYN_LOG                               ``info``
gc_threshold                       DYN_GC_THRESHOLD                      10000 (0 = Python's own)
=================================  ====================================  ===============
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypeVar, cast, final, get_args

from ._gc import DEFAULT_GEN0_THRESHOLD

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "Config",
    "DiscoveryConfig",
    "FrontendConfig",
    "RequestPlaneConfig",
    "SystemConfig",
    "WorkerConfig",
]

DiscoveryBackendName = Literal["mem", "file", "etcd"]
DisconnectPolicy = Literal["kill", "stop"]
RouterMode = Literal["round-robin", "random"]
LogLevel = Literal["debug", "info", "warning", "error"]

_T = TypeVar("_T")

KiB = 1024
MiB = 1024 * 1024

MAX_JSON_DEPTH = 256
"""The deepest JSON nesting a frontend may be configured to accept (the depth check's own bound)."""


@final
@dataclass(frozen=True, kw_only=True)
class DiscoveryConfig:
    """Where workers register and clients look them up."""

    backend: DiscoveryBackendName = "file"
    file_kv: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "dynamo_store_kv")
    etcd_endpoints: tuple[str, ...] = ("http://127.0.0.1:2379",)
    lease_ttl: float = 10.0
    """Seconds a crashed process's registrations survive it."""
    poll_interval: float = 0.1
    """How often the file backend looks for changes."""
    max_record_size: int = 1 * MiB
    """Largest record written or read: a ``put`` value (mem, etcd) or a stored entry
    file (file backend).  Bigger ones are refused by ``put`` and skipped by readers."""


@final
@dataclass(frozen=True, kw_only=True)
class RequestPlaneConfig:
    """The TCP request plane: addresses, limits and liveness."""

    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str | None = None
    auth_token: str | None = None
    max_frame_size: int = 32 * MiB
    max_streams: int = 1024
    """Concurrent streams per connection; more are refused with ResourceExhausted."""
    stream_window: int = 64
    """Items a worker may send ahead of the consumer (per-stream flow-control credits)."""
    max_write_buffer: int = 64 * MiB
    """Bytes queued for one connection before it is declared stuck and closed."""
    connect_timeout: float = 5.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    """A connection with no whole frame for this long (not even a ping) is dead.

    Stray bytes do not count: a peer trickling bytes is cut off."""
    max_connections: int = 512
    """Connections a worker holds at once (authenticated or not); more are refused."""
    max_handshakes: int = 64
    """Connections that have not completed the handshake, at once; a new one beyond
    this takes the slot of the one longest in its handshake."""
    handshake_timeout: float = 5.0
    """Seconds a worker gives a new connection to complete TLS and the handshake."""
    auth_penalty: float = 1.0
    """Failed authentications are judged at most 16 per this many seconds, in total
    (after a short burst); turns go round the peers' addresses, so guessers neither
    guess faster with more connections nor keep out a peer that knows the token."""
    tls: bool = False
    """Run the request plane over TLS (both ends must agree)."""
    tls_cert: Path | None = None
    """PEM certificate chain: a worker's server certificate, a caller's client certificate."""
    tls_key: Path | None = None
    """PEM private key for :attr:`tls_cert`."""
    tls_ca: Path | None = None
    """PEM CA bundle: callers verify workers with it (default: the system trust store);
    workers verify client certificates with it under :attr:`tls_client_auth`."""
    tls_client_auth: bool = False
    """A worker requires a client certificate signed by :attr:`tls_ca` (mutual TLS)."""
    tls_server_name: str | None = None
    """The name a caller expects in workers' certificates (default: the host it dials)."""


@final
@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """How a worker winds requests down."""

    drain_grace: float = 5.0
    """After a stop, a handler still running this long is killed."""
    shutdown_grace: float = 10.0
    """On SIGINT/SIGTERM, in-flight requests are stopped, then killed after this long."""


@final
@dataclass(frozen=True, kw_only=True)
class SystemConfig:
    """The worker's status server (``/metrics``, ``/health``, ``/live``, ``/debug/requests``)."""

    port: int = -1
    """-1 (or unset) turns the server off; 0 picks a free port."""
    host: str = "127.0.0.1"


@final
@dataclass(frozen=True, kw_only=True)
class FrontendConfig:
    """The OpenAI-compatible HTTP frontend."""

    host: str = "127.0.0.1"
    port: int = 8000
    namespace: str = "dynamo"
    on_disconnect: DisconnectPolicy = "kill"
    stop_grace: float = 5.0
    """With ``on_disconnect="stop"``: how long the worker may drain before the kill."""
    keepalive_interval: float = 15.0
    """Seconds of SSE silence before a keep-alive comment is sent (0 turns them off)."""
    max_body_size: int = 16 * MiB
    idle_timeout: float = 30.0
    """Seconds an idle keep-alive HTTP connection stays open."""
    body_timeout: float = 30.0
    """Seconds a client has to send a whole request body; a slower one is answered 408."""
    max_header_size: int = 16 * KiB
    """Bytes of request line and headers; more is refused (414 or 431) or the connection closed."""
    max_json_depth: int = 64
    """How deeply a JSON request body may nest arrays and objects (at most 256)."""
    router_mode: RouterMode = "round-robin"
    http_workers: int = 1
    """Frontend processes serving the port (``SO_REUSEPORT``); raise it when the
    frontend, not the engine, is the bottleneck, up to the core count."""
    migration_limit: int = 0
    """How many times one request may move to another worker after its worker was
    lost mid-stream (Dynamo's ``--migration-limit``); 0 turns migration off."""
    backend_stream_timeout: float = 0.0
    """Seconds a worker may send nothing (before its first item, or between two)
    before its request is killed with reason ``inactivity`` and answered 504
    (Dynamo's ``DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS``); 0 turns it off."""
    max_request_timeout: float = 0.0
    """The longest deadline a request may have: an ``x-request-timeout`` header
    asking for more is cut to it, and a request without one gets it; 0 for none."""
    dead_client_timeout: float = 10.0
    """Seconds after which a client whose network went silent (no FIN, no RST) is
    found out and its request killed: TCP keepalive and ``TCP_USER_TIMEOUT`` on
    accepted connections; 0 turns them off."""
    stream_writes_per_pass: int = 2
    """How many running SSE streams may write per scheduler pass; the rest wait for
    a later pass, in order, while a new stream's first write never waits, so a busy
    frontend still answers new requests fast (:mod:`dynamo_trio.frontend._turns`).
    0: no limit."""
    cleartext_http2: bool = False
    """Serve HTTP/2 without TLS (prior knowledge and ``Upgrade: h2c``).  Off: a
    prior-knowledge preface is answered 505, an upgrade is ignored (HTTP/1.1)."""
    backlog: int = field(default_factory=lambda: _somaxconn())
    """Connections the kernel queues for the HTTP port before they are accepted (the
    ``listen`` backlog); by default the most the kernel allows (``somaxconn``)."""
    http2_max_resets: int = 100
    """Streams an HTTP/2 client may reset on one connection in a burst (they come
    back at a tenth of this per second); beyond it the connection gets GOAWAY
    (ENHANCE_YOUR_CALM) and is closed: the "rapid reset" flood."""
    kserve_grpc_port: int | None = None
    """The port of the KServe v2 gRPC server (on ``host``, beside HTTP; 0: any free
    port); ``None``: no gRPC server."""

    def __post_init__(self) -> None:
        if self.kserve_grpc_port is not None and self.http_workers > 1:
            raise ValueError("the KServe gRPC server runs in one frontend process: http_workers 1")
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH:
            raise ValueError(
                f"max_json_depth must be between 1 and {MAX_JSON_DEPTH}, not {self.max_json_depth}"
            )
        if self.migration_limit < 0:
            raise ValueError(f"migration_limit must be 0 or more, not {self.migration_limit}")
        if self.stream_writes_per_pass < 0:
            raise ValueError(
                f"stream_writes_per_pass must be 0 or more, not {self.stream_writes_per_pass}"
            )
        for name in ("backend_stream_timeout", "max_request_timeout", "dead_client_timeout"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value!r}")


@final
@dataclass(frozen=True, kw_only=True)
class Config:
    """All settings of one process."""

    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    request_plane: RequestPlaneConfig = field(default_factory=RequestPlaneConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    log_level: LogLevel = "info"
    """Used by the command-line entry points when the application has not set logging up."""
    gc_threshold: int = DEFAULT_GEN0_THRESHOLD
    """This process's youngest-generation GC threshold: the ``dynamo-trio`` frontend
    and mocker processes apply it, and freeze their heap, before they serve
    (:mod:`dynamo_trio._gc`).  0 leaves Python's collector as it is (a threshold
    of 700; 2000 on Python 3.13)."""

    def __post_init__(self) -> None:
        if self.gc_threshold < 0:
            raise ValueError(f"gc_threshold must be 0 or more, not {self.gc_threshold}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read every ``DYN_*`` (and ``ETCD_ENDPOINTS``) variable; unset ones keep defaults.

        Raises:
            ValueError: naming the variable, if a value cannot be parsed.
        """
        env = _Env(os.environ if environ is None else environ)
        discovery = DiscoveryConfig()
        request_plane = RequestPlaneConfig()
        worker = WorkerConfig()
        system = SystemConfig()
        frontend = FrontendConfig()
        tls_cert = env.get("DYN_TCP_TLS_CERT", Path, request_plane.tls_cert)
        tls_ca = env.get("DYN_TCP_TLS_CA", Path, request_plane.tls_ca)
        tls_files_given = tls_cert is not None or tls_ca is not None
        return cls(
            discovery=DiscoveryConfig(
                backend=env.choice(
                    "DYN_DISCOVERY_BACKEND", DiscoveryBackendName, discovery.backend
                ),
                file_kv=env.get("DYN_FILE_KV", Path, discovery.file_kv),
                etcd_endpoints=env.get("ETCD_ENDPOINTS", _endpoint_list, discovery.etcd_endpoints),
                lease_ttl=env.get("DYN_LEASE_TTL_SECS", _positive, discovery.lease_ttl),
                poll_interval=env.get("DYN_FILE_KV_POLL_SECS", _positive, discovery.poll_interval),
                max_record_size=env.get(
                    "DYN_DISCOVERY_MAX_RECORD_SIZE", _positive_int, discovery.max_record_size
                ),
            ),
            request_plane=RequestPlaneConfig(
                host=env.get("DYN_TCP_RPC_HOST", str, request_plane.host),
                port=env.get("DYN_TCP_RPC_PORT", _port, request_plane.port),
                advertise_host=env.get(
                    "DYN_TCP_RPC_ADVERTISE_HOST", str, request_plane.advertise_host
                ),
                auth_token=env.get("DYN_REQUEST_PLANE_TOKEN", str, request_plane.auth_token),
                max_frame_size=env.get(
                    "DYN_TCP_MAX_MESSAGE_SIZE", _positive_int, request_plane.max_frame_size
                ),
                max_streams=env.get(
                    "DYN_TCP_MAX_STREAMS", _positive_int, request_plane.max_streams
                ),
                stream_window=env.get("DYN_STREAM_WINDOW", _window, request_plane.stream_window),
                max_write_buffer=env.get(
                    "DYN_TCP_MAX_WRITE_BUFFER", _positive_int, request_plane.max_write_buffer
                ),
                connect_timeout=env.get(
                    "DYN_TCP_CONNECT_TIMEOUT_SECS", _positive, request_plane.connect_timeout
                ),
                heartbeat_interval=env.get(
                    "DYN_HEARTBEAT_INTERVAL_SECS", _positive, request_plane.heartbeat_interval
                ),
                heartbeat_timeout=env.get(
                    "DYN_HEARTBEAT_TIMEOUT_SECS", _positive, request_plane.heartbeat_timeout
                ),
                max_connections=env.get(
                    "DYN_TCP_MAX_CONNECTIONS", _positive_int, request_plane.max_connections
                ),
                max_handshakes=env.get(
                    "DYN_TCP_MAX_HANDSHAKES", _positive_int, request_plane.max_handshakes
                ),
                handshake_timeout=env.get(
                    "DYN_TCP_HANDSHAKE_TIMEOUT_SECS", _positive, request_plane.handshake_timeout
                ),
                auth_penalty=env.get(
                    "DYN_TCP_AUTH_PENALTY_SECS", _non_negative, request_plane.auth_penalty
                ),
                tls=env.get("DYN_TCP_TLS", _bool, tls_files_given),
                tls_cert=tls_cert,
                tls_key=env.get("DYN_TCP_TLS_KEY", Path, request_plane.tls_key),
                tls_ca=tls_ca,
                tls_client_auth=env.get(
                    "DYN_TCP_TLS_CLIENT_AUTH", _bool, request_plane.tls_client_auth
                ),
                tls_server_name=env.get(
                    "DYN_TCP_TLS_SERVER_NAME", str, request_plane.tls_server_name
                ),
            ),
            worker=WorkerConfig(
                drain_grace=env.get("DYN_DRAIN_GRACE_SECS", _non_negative, worker.drain_grace),
                shutdown_grace=env.get(
                    "DYN_SHUTDOWN_GRACE_SECS", _non_negative, worker.shutdown_grace
                ),
            ),
            system=SystemConfig(
                port=env.get("DYN_SYSTEM_PORT", _system_port, system.port),
                host=env.get("DYN_SYSTEM_HOST", str, system.host),
            ),
            frontend=FrontendConfig(
                host=env.get("DYN_HTTP_HOST", str, frontend.host),
                port=env.get("DYN_HTTP_PORT", _port, frontend.port),
                namespace=env.get("DYN_NAMESPACE", str, frontend.namespace),
                on_disconnect=env.choice(
                    "DYN_ON_DISCONNECT", DisconnectPolicy, frontend.on_disconnect
                ),
                stop_grace=env.get("DYN_STOP_GRACE_SECS", _non_negative, frontend.stop_grace),
                keepalive_interval=env.get(
                    "DYN_SSE_KEEPALIVE_SECS", _non_negative, frontend.keepalive_interval
                ),
                max_body_size=env.get(
                    "DYN_HTTP_MAX_BODY_SIZE", _positive_int, frontend.max_body_size
                ),
                idle_timeout=env.get(
                    "DYN_HTTP_IDLE_TIMEOUT_SECS", _positive, frontend.idle_timeout
                ),
                body_timeout=env.get(
                    "DYN_HTTP_BODY_TIMEOUT_SECS", _positive, frontend.body_timeout
                ),
                max_header_size=env.get(
                    "DYN_HTTP_MAX_HEADER_SIZE", _positive_int, frontend.max_header_size
                ),
                max_json_depth=env.get(
                    "DYN_HTTP_MAX_JSON_DEPTH", _json_depth, frontend.max_json_depth
                ),
                router_mode=env.choice("DYN_ROUTER_MODE", RouterMode, frontend.router_mode),
                http_workers=env.get("DYN_HTTP_WORKERS", _positive_int, frontend.http_workers),
                migration_limit=env.get(
                    "DYN_MIGRATION_LIMIT", _non_negative_int, frontend.migration_limit
                ),
                backend_stream_timeout=env.get(
                    "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS",
                    _seconds,
                    frontend.backend_stream_timeout,
                ),
                max_request_timeout=env.get(
                    "DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS",
                    _seconds,
                    frontend.max_request_timeout,
                ),
                dead_client_timeout=env.get(
                    "DYN_HTTP_DEAD_CLIENT_SECS", _seconds, frontend.dead_client_timeout
                ),
                stream_writes_per_pass=env.get(
                    "DYN_HTTP_STREAM_WRITES_PER_PASS",
                    _non_negative_int,
                    frontend.stream_writes_per_pass,
                ),
                cleartext_http2=env.get(
                    "DYN_HTTP_CLEARTEXT_HTTP2", _bool, frontend.cleartext_http2
                ),
                http2_max_resets=env.get(
                    "DYN_HTTP2_MAX_RESETS", _positive_int, frontend.http2_max_resets
                ),
                backlog=env.get("DYN_HTTP_BACKLOG", _positive_int, frontend.backlog),
                kserve_grpc_port=env.get("DYN_KSERVE_GRPC_PORT", _port, frontend.kserve_grpc_port),
            ),
            log_level=env.get("DYN_LOG", _log_level, "info"),
            gc_threshold=env.get("DYN_GC_THRESHOLD", _non_negative_int, DEFAULT_GEN0_THRESHOLD),
        )

    def replace(self, **sections: object) -> Config:
        """A copy with whole sections replaced: ``config.replace(worker=WorkerConfig(...))``."""
        return dataclasses.replace(self, **sections)  # type: ignore[arg-type]


class _Env:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def get(self, name: str, parse: Callable[[str], _T], default: _T) -> _T:
        raw = self._environ.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            return parse(raw.strip())
        except ValueError as exc:
            raise ValueError(f"invalid {name}={raw!r}: {exc}") from None

    def choice(self, name: str, options: object, default: _T) -> _T:
        allowed = get_args(options)

        def parse(raw: str) -> _T:
            if raw not in allowed:
                raise ValueError(f"expected one of {', '.join(allowed)}")
            return cast("_T", raw)

        return self.get(name, parse, default)


def _positive(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def _non_negative(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise ValueError("must be zero or more")
    return value


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < math.inf:
        raise ValueError("must be a finite number of seconds, zero or more")
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("must be zero or a positive integer")
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


_SOMAXCONN: Final = Path("/proc/sys/net/core/somaxconn")
_DEFAULT_BACKLOG: Final = 4096
"""Linux's own default cap, for a system that does not say."""


def _somaxconn() -> int:
    """The kernel's cap on a listen backlog (a larger one is cut to it)."""
    try:
        return max(1, int(_SOMAXCONN.read_text()))
    except (OSError, ValueError):
        return _DEFAULT_BACKLOG


def _bool(raw: str) -> bool:
    word = raw.lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/true/yes/on or 0/false/no/off")


def _window(raw: str) -> int:
    value = _positive_int(raw)
    if value > 1 << 24:  # the request plane's MAX_WINDOW: workers refuse larger windows
        raise ValueError("must be at most 16777216 items")
    return value


def _json_depth(raw: str) -> int:
    value = int(raw)
    if not 1 <= value <= MAX_JSON_DEPTH:
        raise ValueError(f"must be an integer between 1 and {MAX_JSON_DEPTH}")
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number between 0 and 65535")
    return value


def _system_port(raw: str) -> int:
    value = int(raw)
    if value < 0:
        return -1
    return _port(raw)


def _log_level(raw: str) -> LogLevel:
    # Dynamo accepts filters like "debug,dynamo_runtime=info": the first word is the level.
    word = raw.split(",")[0].strip().lower()
    level = {"trace": "debug", "warn": "warning"}.get(word, word)
    if level not in get_args(LogLevel):
        raise ValueError(f"expected one of {', '.join(get_args(LogLevel))}")
    return cast("LogLevel", level)


def _endpoint_list(raw: str) -> tuple[str, ...]:
    endpoints = tuple(
        (url if "://" in url else f"http://{url}").rstrip("/")
        for url in (part.strip() for part in raw.split(","))
        if url
    )
    if not endpoints:
        raise ValueError("no endpoint given")
    return endpoints
