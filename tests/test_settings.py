"""Each setting declared once: its variable, its flag and its row in docs/settings.md agree,
and each ``dynamo-trio`` command loads only what it runs."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dynamo_trio import Config
from dynamo_trio._config import Setting, add_flags, config_from_args, settings, settings_table
from dynamo_trio.cli import COMMANDS, main

SETTINGS = list(settings())
DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"

# The names users, scripts and tests already use: they keep working exactly.
KNOWN_VARIABLES = [
    "DYN_DISCOVERY_BACKEND",
    "DYN_FILE_KV",
    "ETCD_ENDPOINTS",
    "DYN_LEASE_TTL_SECS",
    "DYN_FILE_KV_POLL_SECS",
    "DYN_DISCOVERY_MAX_RECORD_SIZE",
    "DYN_TCP_RPC_HOST",
    "DYN_TCP_RPC_PORT",
    "DYN_TCP_RPC_ADVERTISE_HOST",
    "DYN_REQUEST_PLANE_TOKEN",
    "DYN_TCP_MAX_MESSAGE_SIZE",
    "DYN_TCP_MAX_STREAMS",
    "DYN_STREAM_WINDOW",
    "DYN_TCP_MAX_WRITE_BUFFER",
    "DYN_TCP_CONNECT_TIMEOUT_SECS",
    "DYN_HEARTBEAT_INTERVAL_SECS",
    "DYN_HEARTBEAT_TIMEOUT_SECS",
    "DYN_TCP_MAX_CONNECTIONS",
    "DYN_TCP_MAX_HANDSHAKES",
    "DYN_TCP_HANDSHAKE_TIMEOUT_SECS",
    "DYN_TCP_AUTH_PENALTY_SECS",
    "DYN_TCP_TLS",
    "DYN_TCP_TLS_CERT",
    "DYN_TCP_TLS_KEY",
    "DYN_TCP_TLS_CA",
    "DYN_TCP_TLS_CLIENT_AUTH",
    "DYN_TCP_TLS_SERVER_NAME",
    "DYN_DRAIN_GRACE_SECS",
    "DYN_SHUTDOWN_GRACE_SECS",
    "DYN_SYSTEM_PORT",
    "DYN_SYSTEM_HOST",
    "DYN_HTTP_HOST",
    "DYN_HTTP_PORT",
    "DYN_NAMESPACE",
    "DYN_ON_DISCONNECT",
    "DYN_STOP_GRACE_SECS",
    "DYN_SSE_KEEPALIVE_SECS",
    "DYN_HTTP_MAX_BODY_SIZE",
    "DYN_HTTP_IDLE_TIMEOUT_SECS",
    "DYN_HTTP_BODY_TIMEOUT_SECS",
    "DYN_HTTP_MAX_HEADER_SIZE",
    "DYN_HTTP_MAX_JSON_DEPTH",
    "DYN_ROUTER_MODE",
    "DYN_HTTP_WORKERS",
    "DYN_MIGRATION_LIMIT",
    "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS",
    "DYN_HTTP_MAX_REQUEST_TIMEOUT_SECS",
    "DYN_HTTP_DEAD_CLIENT_SECS",
    "DYN_HTTP_STREAM_WRITES_PER_PASS",
    "DYN_HTTP_STREAM_PASS_BUDGET_MS",
    "DYN_HTTP_CLEARTEXT_HTTP2",
    "DYN_HTTP_BACKLOG",
    "DYN_HTTP2_MAX_RESETS",
    "DYN_KSERVE_GRPC_PORT",
    "DYN_LOG",
    "DYN_GC_THRESHOLD",
]
KNOWN_FLAGS = {
    "--discovery-backend": "discovery.backend",
    "--namespace": "frontend.namespace",
    "--http-host": "frontend.host",
    "--http-port": "frontend.port",
    "--on-disconnect": "frontend.on_disconnect",
    "--stop-grace": "frontend.stop_grace",
    "--sse-keepalive": "frontend.keepalive_interval",
    "--router-mode": "frontend.router_mode",
    "--http-workers": "frontend.http_workers",
    "--stream-writes-per-pass": "frontend.stream_writes_per_pass",
    "--stream-pass-budget-ms": "frontend.stream_pass_budget_ms",
    "--migration-limit": "frontend.migration_limit",
    "--backend-stream-timeout": "frontend.backend_stream_timeout",
    "--max-request-timeout": "frontend.max_request_timeout",
    "--dead-client-timeout": "frontend.dead_client_timeout",
    "--kserve-grpc-port": "frontend.kserve_grpc_port",
    "--gc-threshold": "gc_threshold",
}


def _value(config: Config, name: str) -> object:
    value: object = config
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _other_value(setting: Setting) -> str:
    """A value of ``setting`` that parses and is not its default."""
    default = _value(Config(), setting.name)
    for raw in ("1", "0", "2", "debug", "stop", "random", "etcd", "/tmp/elsewhere"):
        try:
            parsed = setting.parse(raw)
        except ValueError:
            continue
        if parsed != default:
            return raw
    raise AssertionError(f"no sample value for {setting.name}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser


def test_every_field_is_one_setting_with_one_variable_and_one_flag() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)) == len(KNOWN_VARIABLES)
    assert sorted(s.env for s in SETTINGS) == sorted(KNOWN_VARIABLES)
    flags = [s.flag for s in SETTINGS if s.flag is not None]
    assert len(flags) == len(set(flags)) == len(SETTINGS) - 1
    # The one without a flag is the secret: a command line is visible to every user (ps).
    assert [s.env for s in SETTINGS if s.flag is None] == ["DYN_REQUEST_PLANE_TOKEN"]
    by_flag = {s.flag: s.name for s in SETTINGS}
    assert {flag: by_flag.get(flag) for flag in KNOWN_FLAGS} == KNOWN_FLAGS
    for setting in SETTINGS:  # each names a field of Config
        _value(Config(), setting.name)


def test_the_docs_table_is_the_generated_one() -> None:
    """The file's end is ``settings_table()``'s output: paste it there when a setting changes."""
    text = DOCS.read_text()
    assert text.endswith(settings_table())
    assert text.count("\n| `") == len(SETTINGS)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.flag], ids=lambda s: s.name)
def test_a_variable_and_its_flag_give_the_same_config(setting: Setting) -> None:
    raw = _other_value(setting)
    from_env = Config.from_env({setting.env: raw})
    assert setting.flag is not None
    from_flag = config_from_args(_parser().parse_args([setting.flag, raw]), {})
    assert from_env == from_flag != Config.from_env({})
    assert _value(from_flag, setting.name) == setting.parse(raw)


def test_all_flags_at_once_override_all_variables() -> None:
    flagged = [s for s in SETTINGS if s.flag and s.env != "DYN_KSERVE_GRPC_PORT"]
    environ = {s.env: _other_value(s) for s in flagged}
    argv = [part for s in flagged for part in (s.flag or "", _other_value(s))]
    want = Config.from_env(environ)
    assert config_from_args(_parser().parse_args(argv), {}) == want
    assert config_from_args(_parser().parse_args([]), environ) == want
    contrary = {s.env: _value_as_default(s) for s in flagged}
    assert config_from_args(_parser().parse_args(argv), contrary) == want
    assert all(_value(want, s.name) != _value(Config(), s.name) for s in flagged)


def _value_as_default(setting: Setting) -> str:
    value = _value(Config(), setting.name)
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(value)
    return "" if value is None else str(value)


@pytest.mark.parametrize(("flag", "raw"), [("--http-port", "70000"), ("--tcp-tls", "maybe")])
def test_a_bad_flag_is_refused_as_its_variable_is(flag: str, raw: str) -> None:
    setting = next(s for s in SETTINGS if s.flag == flag)
    with pytest.raises(ValueError, match=setting.env):
        Config.from_env({setting.env: raw})
    with pytest.raises(SystemExit):
        _parser().parse_args([flag, raw])


def test_the_dispatcher_names_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, code in (([], 2), (["serve"], 2), (["--help"], 0)):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == code
        out, err = capsys.readouterr()
        assert f"{{{','.join(COMMANDS)}}}" in (out if code == 0 else err)


# What each command may not load: the frontend neither the mocker, the engines nor
# KServe (not asked for); a mocker nothing of HTTP; an engine worker neither.
_HTTP = {"quart", "flask", "hypercorn", "dynamo_trio.frontend", "dynamo_trio.edge"}
_KSERVE = {"dynamo_trio.kserve", "grpc"}
_FORBIDDEN = {
    "frontend": ({"dynamo_trio.mocker", "dynamo_trio.engines", *_KSERVE}, True),
    "run": ({"dynamo_trio.engines", *_KSERVE}, True),
    "mocker": ({"dynamo_trio.engines", *_HTTP, *_KSERVE}, False),
    "transformers": ({"dynamo_trio.mocker", "torch", *_HTTP, *_KSERVE}, False),
    "vllm": ({"dynamo_trio.mocker", "torch", "vllm", *_HTTP, *_KSERVE}, False),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_imports_only_what_it_runs(command: str) -> None:
    """In a fresh interpreter: the command parses its flags and builds its config
    (``trio.run`` replaced: nothing serves), or, for the engine workers, which
    need a checkpoint, shows its help; then its modules are listed."""
    script = textwrap.dedent(
        """
        import sys, trio
        from dynamo_trio.cli import main

        def report(*args, **kwargs):
            raise SystemExit(0)

        trio.run = report
        try:
            main(sys.argv[1:])
        except SystemExit as exit:
            assert exit.code == 0, exit.code
        print(" ".join(sorted(sys.modules)))
        """
    )
    argv = {"mocker": ["--model-name", "m"], "transformers": ["--help"], "vllm": ["--help"]}
    done = subprocess.run(
        [sys.executable, "-c", script, command, *argv.get(command, [])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin", "DYN_DISCOVERY_BACKEND": "mem"},
    )
    loaded = done.stdout.splitlines()[-1].split()  # after any --help
    forbidden, serves_http = _FORBIDDEN[command]
    packages = {name for module in loaded for name in _prefixes(module)}
    assert packages & forbidden == set()
    assert ("quart" in packages) is serves_http
    assert "dynamo_trio._config" in packages


def _prefixes(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]
