"""The HTTP listen backlog is a setting, defaulting to the kernel's own cap."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import pytest
import trio

from dynamo_trio import Config
from dynamo_trio.frontend._app import _hypercorn_config

SOMAXCONN = Path("/proc/sys/net/core/somaxconn")


def test_the_backlog_defaults_to_somaxconn_and_the_environment_sets_it() -> None:
    expected = int(SOMAXCONN.read_text()) if SOMAXCONN.exists() else 4096
    assert Config.from_env({}).frontend.backlog == expected
    assert Config.from_env({"DYN_HTTP_BACKLOG": "123"}).frontend.backlog == 123
    with pytest.raises(ValueError, match="DYN_HTTP_BACKLOG"):
        Config.from_env({"DYN_HTTP_BACKLOG": "0"})


def test_the_frontend_listens_with_it() -> None:
    frontend = Config.from_env({"DYN_HTTP_BACKLOG": "321"}).frontend
    assert _hypercorn_config(frontend, 1.0).backlog == 321


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_a_listening_socket_has_the_backlog_it_was_given(nursery) -> None:
    from hypercorn.config import Config as HypercornConfig

    from dynamo_trio.edge import listen_sockets, serve_http

    from ._serving import answer_lifespan

    async def app(scope, receive, send):
        await answer_lifespan(receive, send)

    config = HypercornConfig()
    config.accesslog = None
    config.backlog = 321
    binds = await nursery.start(
        partial(
            serve_http, app, config, trio.sleep_forever, sockets=listen_sockets(["127.0.0.1:0"])
        )
    )
    port = binds[0].rsplit(":", 1)[1]
    listed = await trio.run_process(
        ["ss", "-ltnH", f"sport = :{port}"], capture_stdout=True, check=True
    )
    listing = listed.stdout.decode().split()
    assert listing[2] == "321", listing  # Send-Q of a listening socket: its backlog
