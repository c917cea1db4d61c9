"""A frontend and workers in the test's own process, as ``python -m
dynamo_trio.frontend``, ``tests/e2e/_model_worker.py`` and ``python -m dynamo_trio
mocker`` would run them.

The frontend is :func:`serve_frontend` on 127.0.0.1 with the config its command
line would build (flags and ``DYN_*`` variables); a worker serves the model
worker's models (its handlers' ``start`` and ``exit`` events kept in a list
instead of printed) or the mocker's.  Discovery is a :class:`MemoryStore`; HTTP
and the request plane are loopback TCP, or with ``memory=True`` memory streams
(:mod:`tests._memhttp`, :mod:`tests._memplane`: the test may run on the
autojump clock; its clients come from :func:`~tests._memhttp.http_client`).
What needs processes (signals, a worker killed, the command line) uses
:mod:`tests._procs` instead; with ``processes=True`` a cluster shares their
discovery, so that a frontend here serves worker processes the test kills.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from functools import partial
from typing import TYPE_CHECKING, Any, final

import trio

from dynamo_trio import Config
from dynamo_trio._config import add_flags, config_from_args
from dynamo_trio.discovery import MemoryStore
from dynamo_trio.edge import Edge, listen_sockets, status_routes
from dynamo_trio.frontend import serve_frontend
from dynamo_trio.frontend._app import FLUSH_GRACE, _hypercorn_config, build_app, build_edge
from dynamo_trio.frontend._pipeline import Pipeline
from dynamo_trio.mocker import MockerSettings
from dynamo_trio.mocker._main import MODELS as MOCKER_MODELS, add_mocker_flags
from dynamo_trio.mocker._worker import serve_mocker
from dynamo_trio.runtime import DistributedRuntime
from tests._memhttp import http_client, serve_memory
from tests._memplane import MemoryTransport
from tests._metrics import scrape
from tests.e2e._model_worker import serve_models

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable


def first_event(
    events: list[dict[str, Any]], event: str, fields: dict[str, Any]
) -> dict[str, Any] | None:
    """The first of ``events`` named ``event`` whose ``fields`` match, if any."""
    for candidate in events:
        if candidate.get("event") == event and all(
            candidate.get(k) == v for k, v in fields.items()
        ):
            return candidate
    return None


@final
class Events:
    """A worker's reported events, read as a process's JSON lines are (``Proc``)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = trio.Event()

    def report(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Wait until another event is reported."""
        await self._changed.wait()

    async def wait_for(self, event: str, *, within: float = 10.0, **fields: Any) -> dict[str, Any]:
        """The first event named ``event`` whose fields match, waiting up to ``within`` s."""
        with trio.fail_after(within):
            while True:
                found = first_event(self.events, event, fields)
                if found is not None:
                    return found
                await self._changed.wait()


@final
class Served:
    """A running in-process stack: the frontend's URL, the worker's events and status URL."""

    def __init__(self, url: str, worker: Events, worker_status: str, log: Records) -> None:
        self.url = url
        self.worker = worker
        self.worker_status = worker_status
        self._log = log

    def log(self) -> str:
        """What the process's log (its stderr) would say: every record since the start."""
        return self._log.text()

    async def metric(self, name: str, *, worker: bool = False, **labels: str) -> float:
        """Sum of the samples of ``name`` (matching ``labels``) on the frontend or worker."""
        return await scrape(self.worker_status if worker else self.url, name, **labels)


def frontend_config(environ: dict[str, str], *flags: str) -> Config:
    """The config ``python -m dynamo_trio.frontend *flags`` builds in ``environ``."""
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return config_from_args(parser.parse_args(list(flags)), environ)


@final
class Records(logging.Handler):
    """Every log record of the test's process while a :class:`Cluster` runs: what the
    processes it stands for would have written on stderr."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        """What a process's log (its stderr) would say: every record since the start."""
        return "\n".join(self.format(record) for record in self.records)


async def _logging_into(handler: logging.Handler, *, task_status: trio.TaskStatus[None]) -> None:
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        task_status.started()
        await trio.sleep_forever()
    finally:
        root.removeHandler(handler)


async def _hold(opened: Any, *, task_status: trio.TaskStatus[Any]) -> None:
    async with opened as value:
        task_status.started(value)
        await trio.sleep_forever()


@final
class Cluster:
    """Runtimes of one test on one :class:`MemoryStore`: workers and frontends, each
    configured as its command line would be in ``env`` (``tests/_procs.py``'s
    children's ``DYN_*`` test settings), serving in ``nursery``.  With
    ``processes=True`` they use ``env``'s discovery instead (the file store of the
    processes started in ``env``): they and those processes see each other."""

    def __init__(
        self,
        nursery: trio.Nursery,
        env: dict[str, str],
        *,
        memory: bool = False,
        processes: bool = False,
    ) -> None:
        assert not (memory and processes), "processes reach each other over TCP"
        self.nursery = nursery
        self.env = env
        self.processes = processes
        self.store = MemoryStore()
        self.log = Records()
        self._logging = False
        self.transport = MemoryTransport() if memory else None
        """The request plane's network, with ``memory=True``."""
        self.grpc: dict[str, str] = {}
        """Each frontend's KServe gRPC ``host:port`` (``--kserve-grpc-port``), by its URL."""

    async def _runtime(self, config: Config) -> DistributedRuntime:
        if not self._logging:
            await self.nursery.start(_logging_into, self.log)
            self._logging = True
        if not self.processes:
            config = config.replace(discovery=dataclasses.replace(config.discovery, backend="mem"))
        if self.transport is not None:  # its status server: over memory too (status_url)
            config = config.replace(system=dataclasses.replace(config.system, port=-1))
        runtime: DistributedRuntime = await self.nursery.start(
            _hold, DistributedRuntime(config, memory_store=self.store, transport=self.transport)
        )
        return runtime

    async def status_url(self, runtime: DistributedRuntime) -> str:
        """The URL of ``runtime``'s status routes (served over memory with ``memory=True``)."""
        if self.transport is None:
            assert runtime.status_url is not None
            return runtime.status_url
        edge = Edge(
            status_routes(
                health=lambda: (200, {"status": "ready"}),
                metrics=runtime.registry,
                inflight=runtime.inflight,
            )
        )
        return await serve_memory(self.nursery, edge)

    async def worker(self) -> DistributedRuntime:
        """A runtime configured as a worker process's would be, to serve what the test likes."""
        return await self._runtime(Config.from_env(self.env))

    async def model_worker(
        self, events: Events, *, inter_token_latency_ms: float = 20.0, ttft_ms: float = 0.0
    ) -> DistributedRuntime:
        """``tests/e2e/_model_worker.py``'s models, their events reported to ``events``."""
        worker = await self._runtime(Config.from_env(self.env))
        settings = MockerSettings(inter_token_latency_ms=inter_token_latency_ms, ttft_ms=ttft_ms)
        await self.nursery.start(serve_models, worker, settings, events.report)
        return worker

    async def mocker(self, *flags: str) -> DistributedRuntime:
        """``python -m dynamo_trio mocker *flags``: its models are listed once a frontend
        sees them (:func:`wait_for_models`)."""
        parser = argparse.ArgumentParser()
        parser.add_argument("--component", default="mocker")
        add_mocker_flags(parser, named=False)
        add_flags(parser)
        args = parser.parse_args(list(flags))
        config = config_from_args(args, self.env)
        engine = MockerSettings(
            **{item.name: getattr(args, item.name) for item in dataclasses.fields(MockerSettings)}
        )
        worker = await self._runtime(config)
        self.nursery.start_soon(
            partial(
                serve_mocker,
                worker,
                engine,
                **{name: getattr(args, name) for name, _, _ in MOCKER_MODELS},
                namespace=config.frontend.namespace,
                component=args.component,
            )
        )
        return worker

    async def frontend(self, *flags: str, frontend_env: dict[str, str] | None = None) -> str:
        """``python -m dynamo_trio.frontend --http-port 0 *flags`` (with ``frontend_env``
        over ``env``) serving on 127.0.0.1; its URL."""
        config = frontend_config({**self.env, **(frontend_env or {})}, "--http-port", "0", *flags)
        runtime = await self._runtime(config)
        if self.transport is not None:
            url: str = await self.nursery.start(_serve_memory, runtime, config)
            return url
        grpc: list[str] = []
        url = await self.nursery.start(
            _serve, runtime, config, listen_sockets(["127.0.0.1:0"]), grpc.append
        )
        if grpc:
            self.grpc[url] = grpc[0]
        return url


async def serve_stack(
    nursery: trio.Nursery,
    env: dict[str, str],
    *frontend_flags: str,
    inter_token_latency_ms: float = 20.0,
    ttft_ms: float = 0.0,
    frontend_env: dict[str, str] | None = None,
    memory: bool = False,
) -> Served:
    """The model worker and a frontend serving in ``nursery``, once the frontend lists
    every model (see :class:`Cluster` for ``env``, ``frontend_flags``, ``frontend_env``
    and ``memory``)."""
    cluster = Cluster(nursery, env, memory=memory)
    events = Events()
    worker = await cluster.model_worker(
        events, inter_token_latency_ms=inter_token_latency_ms, ttft_ms=ttft_ms
    )
    url = await cluster.frontend(*frontend_flags, frontend_env=frontend_env)
    await wait_for_models(url, MODELS, within=15)
    return Served(url, events, await cluster.status_url(worker), cluster.log)


async def _serve(
    runtime: DistributedRuntime,
    config: Config,
    sockets: list[socket.socket],
    on_grpc_listening: Callable[[str], object],
    *,
    task_status: trio.TaskStatus[str],
) -> None:
    await serve_frontend(
        runtime,
        config.frontend,
        shutdown_grace=config.worker.shutdown_grace,
        sockets=sockets,
        on_grpc_listening=on_grpc_listening,
        task_status=task_status,
    )


async def _serve_memory(
    runtime: DistributedRuntime, config: Config, *, task_status: trio.TaskStatus[str]
) -> None:
    """:func:`serve_frontend`'s app and edge, over memory streams (no drain on the way out)."""
    frontend = config.frontend
    async with trio.open_nursery() as nursery:
        pipeline = Pipeline(runtime, frontend, nursery)
        pipeline.turns.install()
        try:
            await pipeline.start()
            url = await serve_memory(
                nursery,
                build_edge(pipeline, build_app(pipeline)),
                _hypercorn_config(frontend, FLUSH_GRACE),
                cleartext_http2=frontend.cleartext_http2,
                http2_max_resets=frontend.http2_max_resets,
            )
            task_status.started(url)
            await trio.sleep_forever()
        finally:
            pipeline.turns.uninstall()


MODELS = frozenset(
    {
        "mock",
        "mock-embed",
        "prefill",
        "stall",
        "slow-embed",
        "mock-image",
        "mock-video",
        "mock-speech",
    }
)
"""What ``tests/e2e/_model_worker.py`` registers."""


async def listed_models(url: str) -> set[str]:
    async with http_client(url) as http:
        response = await http.get("/v1/models")
    assert response.status_code == 200, response.text
    return {model["id"] for model in response.json()["data"]}


async def wait_for_models(url: str, expected: frozenset[str] | set[str], *, within: float) -> None:
    """Poll ``/v1/models`` until it lists exactly ``expected``."""
    with trio.fail_after(within):
        while await listed_models(url) != expected:  # noqa: ASYNC110 - polls another process
            await trio.sleep(0.02)
