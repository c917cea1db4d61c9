"""Every limit, timeout and ``DYN_*`` environment variable, each declared once.

A setting is a section field declared with :func:`_setting`; :meth:`Config.from_env`,
the commands' flags and docs/settings.md's table are read off the declarations.
:class:`Config` is built once per process and passed down; nothing else reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from types import FunctionType
from typing import TYPE_CHECKING, Any, Literal, cast, final, get_args

from ._gc import DEFAULT_GEN0_THRESHOLD

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

DiscoveryBackendName = Literal["mem", "file", "etcd"]
DisconnectPolicy = Literal["kill", "stop"]
RouterMode = Literal["round-robin", "random"]
LogLevel = Literal["debug", "info", "warning", "error"]

KiB = 1024
MiB = 1024 * 1024

MAX_JSON_DEPTH = 256
"""The deepest JSON nesting a frontend may be configured to accept (the depth check's own bound)."""


def _number(low: float, *, strict: bool = False, finite: bool = False) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if not (value > low if strict else value >= low) or (finite and math.isinf(value)):
            above = f"more than {low:g}" if strict else f"{low:g} or more"
            raise ValueError(f"must be a{' finite' if finite else ''} number, {above}")
        return value

    return parse


def _integer(low: int, high: float = math.inf) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if not low <= value <= high:
            raise ValueError(
                f"must be an integer from {low}" + (f" to {high}" if high < math.inf else " up")
            )
        return value

    return parse


@final
class _Choice:
    """A parser of one of a ``Literal``'s words."""

    def __init__(self, options: object) -> None:
        self.allowed: tuple[str, ...] = get_args(options)

    def __call__(self, raw: str) -> Any:
        if raw not in self.allowed:
            raise ValueError(f"expected one of {', '.join(self.allowed)}")
        return raw


def _bool(raw: str) -> bool:
    word = raw.lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/true/yes/on or 0/false/no/off")


_positive = _number(0, strict=True)
_non_negative = _number(0)
_seconds = _number(0, finite=True)  # (milliseconds too)
_positive_int = _integer(1)
_non_negative_int = _integer(0)
_port = _integer(0, 65535)


def _system_port(raw: str) -> int:
    return -1 if int(raw) < 0 else _port(raw)


def _log_level(raw: str) -> LogLevel:
    # Dynamo accepts filters like "debug,dynamo_runtime=info": the first word is the level.
    word = raw.split(",")[0].strip().lower()
    level: LogLevel = _Choice(LogLevel)({"trace": "debug", "warn": "warning"}.get(word, word))
    return level


def _endpoint_list(raw: str) -> tuple[str, ...]:
    urls = (url.strip() for url in raw.split(","))
    endpoints = tuple((u if "://" in u else f"http://{u}").rstrip("/") for u in urls if u)
    if not endpoints:
        raise ValueError("no endpoint given")
    return endpoints


def _temporary_kv() -> Path:
    return Path(tempfile.gettempdir()) / "dynamo_store_kv"


def _somaxconn() -> int:
    """The kernel's cap on a listen backlog; Linux's default where the system does not say."""
    try:
        return max(1, int(Path("/proc/sys/net/core/somaxconn").read_text()))
    except (OSError, ValueError):
        return 4096


@final
@dataclass(frozen=True)
class Setting:
    """One setting's declaration: where it is read from, how, and what it means."""

    name: str
    """Its path in :class:`Config`: ``frontend.port``."""
    env: str
    flag: str | None
    """``None`` for a secret, which has no place on a command line (``ps`` shows it)."""
    parse: Callable[[str], object]
    doc: str
    default: str
    """The default, as the docs and ``--help`` show it."""

    def read(self, raw: str) -> object:
        """``raw`` parsed, or a ValueError naming the variable."""
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            raise ValueError(f"invalid {self.env}={raw!r}: {exc}") from None

    def check_flag(self, raw: str) -> str:
        """``raw`` itself if it parses (argparse's ``type``)."""
        try:
            self.parse(raw.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return raw


def _setting(
    env: str,
    default: Any,
    parse: Callable[[str], object],
    doc: str,
    *,
    flag: str | None = "",
    shown: str = "",
) -> Any:
    """A dataclass field declaring a setting; a function ``default`` is a factory,
    ``flag=""`` derives the flag from ``env``."""
    if flag == "":
        flag = "--" + env.removeprefix("DYN_").lower().replace("_", "-")
    if isinstance(parse, _Choice):
        doc += f": {', '.join(parse.allowed)}"
    spec = dict(env=env, flag=flag, parse=parse, doc=doc, default=shown or _shown(default))
    if isinstance(default, FunctionType):
        return field(default_factory=default, metadata=spec)
    return field(default=default, metadata=spec)


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, int) and value and value % MiB == 0:
        return f"{value // MiB} MiB"
    return f"{value:g}" if isinstance(value, float) else str(value)


@final
@dataclass(frozen=True, kw_only=True)
class DiscoveryConfig:
    """Where workers register and clients look them up."""

    backend: DiscoveryBackendName = _setting(
        "DYN_DISCOVERY_BACKEND", "file", _Choice(DiscoveryBackendName), "where processes meet"
    )
    file_kv: Path = _setting(
        "DYN_FILE_KV",
        _temporary_kv,
        Path,
        "the file backend's directory",
        shown="$TMPDIR/dynamo_store_kv",
    )
    etcd_endpoints: tuple[str, ...] = _setting(
        "ETCD_ENDPOINTS", ("http://127.0.0.1:2379",), _endpoint_list, "etcd URLs, comma separated"
    )
    lease_ttl: float = _setting(
        "DYN_LEASE_TTL_SECS", 10.0, _positive, "seconds a crashed process's records survive it"
    )
    poll_interval: float = _setting(
        "DYN_FILE_KV_POLL_SECS", 0.1, _positive, "seconds between the file backend's looks"
    )
    max_record_size: int = _setting(
        "DYN_DISCOVERY_MAX_RECORD_SIZE", MiB, _positive_int, "largest record put or read (bytes)"
    )


@final
@dataclass(frozen=True, kw_only=True)
class RequestPlaneConfig:
    """The TCP request plane: addresses, limits and liveness."""

    host: str = _setting("DYN_TCP_RPC_HOST", "127.0.0.1", str, "the address a worker binds")
    port: int = _setting("DYN_TCP_RPC_PORT", 0, _port, "the port a worker binds (0: any)")
    advertise_host: str | None = _setting(
        "DYN_TCP_RPC_ADVERTISE_HOST", None, str, "the address callers dial", shown="the bind host"
    )
    auth_token: str | None = _setting(
        "DYN_REQUEST_PLANE_TOKEN", None, str, "the connections' shared secret", flag=None
    )
    max_frame_size: int = _setting(
        "DYN_TCP_MAX_MESSAGE_SIZE", 32 * MiB, _positive_int, "largest frame (bytes)"
    )
    max_streams: int = _setting(
        "DYN_TCP_MAX_STREAMS", 1024, _positive_int, "streams at once per connection"
    )
    stream_window: int = _setting(
        "DYN_STREAM_WINDOW", 64, _integer(1, 1 << 24), "items a stream sends ahead of its reader"
    )
    max_write_buffer: int = _setting(
        "DYN_TCP_MAX_WRITE_BUFFER",
        64 * MiB,
        _positive_int,
        "bytes queued before a connection is cut",
    )
    connect_timeout: float = _setting(
        "DYN_TCP_CONNECT_TIMEOUT_SECS", 5.0, _positive, "seconds to connect to a worker"
    )
    heartbeat_interval: float = _setting(
        "DYN_HEARTBEAT_INTERVAL_SECS", 1.0, _positive, "seconds between pings"
    )
    heartbeat_timeout: float = _setting(
        "DYN_HEARTBEAT_TIMEOUT_SECS", 5.0, _positive, "seconds without a whole frame: dead"
    )
    max_connections: int = _setting(
        "DYN_TCP_MAX_CONNECTIONS", 512, _positive_int, "connections a worker holds at once"
    )
    max_handshakes: int = _setting(
        "DYN_TCP_MAX_HANDSHAKES", 64, _positive_int, "connections in their handshake at once"
    )
    handshake_timeout: float = _setting(
        "DYN_TCP_HANDSHAKE_TIMEOUT_SECS", 5.0, _positive, "seconds for TLS and the handshake"
    )
    auth_penalty: float = _setting(
        "DYN_TCP_AUTH_PENALTY_SECS", 1.0, _non_negative, "seconds per 16 failed authentications"
    )
    tls: bool = _setting(
        "DYN_TCP_TLS", False, _bool, "TLS on the request plane", shown="1 if a TLS file is set"
    )
    tls_cert: Path | None = _setting("DYN_TCP_TLS_CERT", None, Path, "PEM certificate chain")
    tls_key: Path | None = _setting("DYN_TCP_TLS_KEY", None, Path, "PEM private key")
    tls_ca: Path | None = _setting(
        "DYN_TCP_TLS_CA", None, Path, "PEM CA bundle", shown="the system trust store"
    )
    tls_client_auth: bool = _setting(
        "DYN_TCP_TLS_CLIENT_AUTH", False, _bool, "workers require client certificates (mTLS)"
    )
    tls_server_name: str | None = _setting(
        "DYN_TCP_TLS_SERVER_NAME",
        None,
        str,
        "the name in workers' certificates",
        shown="the host dialled",
    )


@final
@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """How a worker winds requests down."""

    drain_grace: float = _setting(
        "DYN_DRAIN_GRACE_SECS", 5.0, _non_negative, "seconds a stopped handler runs before a kill"
    )
    shutdown_grace: float = _setting(
        "DYN_SHUTDOWN_GRACE_SECS", 10.0, _non_negative, "seconds to drain on SIGINT/SIGTERM"
    )


@final
@dataclass(frozen=True, kw_only=True)
class SystemConfig:
    """The worker's status server (``/metrics``, ``/health``, ``/live``, ``/debug/requests``)."""

    port: int = _setting(
        "DYN_SYSTEM_PORT", -1, _system_port, "the status server's port (-1: off, 0: any)"
    )
    host: str = _setting("DYN_SYSTEM_HOST", "127.0.0.1", str, "the status server's address")


@final
@dataclass(frozen=True, kw_only=True)
class FrontendConfig:
    """The OpenAI-compatible HTTP frontend."""

    host: str = _setting("DYN_HTTP_HOST", "127.0.0.1", str, "the address to bind")
    port: int = _setting("DYN_HTTP_PORT", 8000, _port, "the port to bind (0: any)")
    namespace: str = _setting("DYN_NAMESPACE", "dynamo", str, "the namespace served")
    on_disconnect: DisconnectPolicy = _setting(
        "DYN_ON_DISCONNECT", "kill", _Choice(DisconnectPolicy), "what a client hang-up does"
    )
    stop_grace: float = _setting(
        "DYN_STOP_GRACE_SECS",
        5.0,
        _non_negative,
        "on_disconnect=stop: seconds before the kill",
        flag="--stop-grace",
    )
    keepalive_interval: float = _setting(
        "DYN_SSE_KEEPALIVE_SECS",
        15.0,
        _non_negative,
        "seconds of SSE silence before a keep-alive (0: off)",
        flag="--sse-keepalive",
    )
    max_body_size: int = _setting(
        "DYN_HTTP_MAX_BODY_SIZE", 16 * MiB, _positive_int, "largest request body (bytes)"
    )
    idle_timeout: float = _setting(
        "DYN_HTTP_IDLE_TIMEOUT_SECS", 30.0, _positive, "seconds an idle connection stays"
    )
    body_timeout: float = _setting(
        "DYN_HTTP_BODY_TIMEOUT_SECS", 30.0, _positive, "seconds to send a body, else 408"
    )
    max_header_size: int = _setting(
        "DYN_HTTP_MAX_HEADER_SIZE", 16 * KiB, _positive_int, "largest request head", shown="16 KiB"
    )
    max_json_depth: int = _setting(
        "DYN_HTTP_MAX_JSON_DEPTH", 64, _integer(1, MAX_JSON_DEPTH), "deepest JSON body nesting"
    )
    router_mode: RouterMode = _setting(
        "DYN_ROUTER_MODE", "round-robin", _Choice(RouterMode), "how requests spread over instances"
    )
    http_workers: int = _setting(
        "DYN_HTTP_WORKERS", 1, _positive_int, "processes serving the port (SO_REUSEPORT)"
    )
    migration_limit: int = _setting(
        "DYN_MIGRATION_LIMIT", 0, _non_negative_int, "moves of a request whose worker was lost"
    )
    backend_stream_timeout: float = _setting(
        "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS",
        0.0,
        _seconds,
        "seconds of worker silence: 504 (0: no bound)",
        flag="--backend-stream-timeout",
    )
    max_request_timeout: float = _setting(
        "DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS",
        0.0,
        _seconds,
        "longest deadline (0: none)",
        flag="--max-request-timeout",
    )
    dead_client_timeout: float = _setting(
        "DYN_HTTP_DEAD_CLIENT_SECS",
        10.0,
        _seconds,
        "seconds to find a silent client (0: off)",
        flag="--dead-client-timeout",
    )
    stream_writes_per_pass: int = _setting(
        "DYN_HTTP_STREAM_WRITES_PER_PASS",
        2,
        _non_negative_int,
        "SSE streams that write per scheduler pass (0: all)",
        flag="--stream-writes-per-pass",
    )
    stream_pass_budget_ms: float = _setting(
        "DYN_HTTP_STREAM_PASS_BUDGET_MS",
        1.0,
        _seconds,
        "ms a scheduler pass runs before SSE streams take turns (0: always)",
        flag="--stream-pass-budget-ms",
    )
    cleartext_http2: bool = _setting(
        "DYN_HTTP_CLEARTEXT_HTTP2", False, _bool, "serve HTTP/2 without TLS (h2c)"
    )
    backlog: int = _setting(
        "DYN_HTTP_BACKLOG", _somaxconn, _positive_int, "the listen backlog", shown="somaxconn"
    )
    http2_max_resets: int = _setting(
        "DYN_HTTP2_MAX_RESETS", 100, _positive_int, "HTTP/2 stream resets per connection burst"
    )
    kserve_grpc_port: int | None = _setting(
        "DYN_KSERVE_GRPC_PORT",
        None,
        _port,
        "the KServe v2 gRPC server's port (0: any)",
        shown="none (no server)",
    )

    def __post_init__(self) -> None:
        if self.kserve_grpc_port is not None and self.http_workers > 1:
            raise ValueError("the KServe gRPC server runs in one frontend process: http_workers 1")
        _check(self, f"between 1 and {MAX_JSON_DEPTH}", MAX_JSON_DEPTH, "max_json_depth", low=1)
        _check(self, "0 or more", math.inf, "migration_limit", "stream_writes_per_pass")
        seconds = ("backend_stream_timeout", "max_request_timeout", "dead_client_timeout")
        _check(self, "finite seconds >= 0", sys.float_info.max, *seconds)
        _check(self, "finite milliseconds >= 0", sys.float_info.max, "stream_pass_budget_ms")


def _check(section: object, wanted: str, high: float, *names: str, low: float = 0) -> None:
    """Bounds that the settings' parsers check again, for a section made directly."""
    for name in names:
        if not low <= getattr(section, name) <= high:
            raise ValueError(f"{name} must be {wanted}, not {getattr(section, name)!r}")


@final
@dataclass(frozen=True, kw_only=True)
class Config:
    """All settings of one process."""

    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    request_plane: RequestPlaneConfig = field(default_factory=RequestPlaneConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    log_level: LogLevel = _setting(
        "DYN_LOG", "info", _log_level, "debug, info, warning or error", flag="--log-level"
    )
    gc_threshold: int = _setting(
        "DYN_GC_THRESHOLD",
        DEFAULT_GEN0_THRESHOLD,
        _non_negative_int,
        "youngest-generation GC threshold, heap frozen (0: Python's own)",
    )

    def __post_init__(self) -> None:
        _check(self, "0 or more", math.inf, "gc_threshold")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read every ``DYN_*`` (and ``ETCD_ENDPOINTS``) variable; unset ones keep defaults.
        A value that cannot be parsed is a ValueError naming its variable."""
        environ = os.environ if environ is None else environ
        raw = {s.env: v for s in settings() if (v := environ.get(s.env, "")).strip()}
        if "DYN_TCP_TLS" not in raw and ("DYN_TCP_TLS_CERT" in raw or "DYN_TCP_TLS_CA" in raw):
            raw["DYN_TCP_TLS"] = "1"  # a TLS file turns TLS on unless told otherwise
        return cast("Config", _build(cls, raw))

    def replace(self, **sections: object) -> Config:
        """A copy with whole sections replaced: ``config.replace(worker=WorkerConfig(...))``."""
        return dataclasses.replace(self, **sections)  # type: ignore[arg-type]


def _build(kind: type[Any], raw: Mapping[str, str]) -> Any:
    values: dict[str, object] = {}
    for item in dataclasses.fields(kind):
        if "env" not in item.metadata:  # a section
            values[item.name] = _build(cast("type[Any]", item.default_factory), raw)
        elif (env := item.metadata["env"]) in raw:
            values[item.name] = Setting(name=item.name, **item.metadata).read(raw[env])
    return kind(**values)


def settings(kind: type[Any] = Config, prefix: str = "") -> Iterator[Setting]:
    """Every setting, in declaration order (sections first)."""
    for item in dataclasses.fields(kind):
        if "env" in item.metadata:
            yield Setting(name=prefix + item.name, **item.metadata)
        else:
            yield from settings(cast("type[Any]", item.default_factory), f"{item.name}.")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every setting that has one, grouped by section; unset flags
    leave the environment's value (read them with :func:`config_from_args`)."""
    if parser.usage is None:  # too many flags for a usage line
        parser.usage = "%(prog)s [options]"
    for section, group in groupby(settings(), lambda s: s.name.rpartition(".")[0] or "process"):
        arguments = parser.add_argument_group(f"{section} settings")
        for setting in group:
            if setting.flag is None:
                continue
            arguments.add_argument(
                setting.flag,
                dest=setting.env,
                type=setting.check_flag,
                default=argparse.SUPPRESS,
                metavar="VALUE",
                help=f"{setting.doc} ({setting.env}; default {setting.default})".replace("%", "%%"),
            )


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """The environment's config with the flags given in ``args`` over it."""
    return Config.from_env(
        {**(os.environ if environ is None else environ), **flag_environment(args)}
    )


def flag_environment(args: argparse.Namespace) -> dict[str, str]:
    """The flags given in ``args`` as environment variables, for a child process."""
    return {s.env: getattr(args, s.env) for s in settings() if hasattr(args, s.env)}


def settings_table() -> str:
    """docs/settings.md's table (a test keeps the file equal to it)."""
    rows = ["| setting | environment | flag | default | meaning |", "|---|---|---|---|---|"]
    for s in settings():
        flag = f"`{s.flag}`" if s.flag else "none (a secret)"
        rows.append(f"| `{s.name}` | `{s.env}` | {flag} | {s.default} | {s.doc} |")
    return "\n".join(rows) + "\n"
