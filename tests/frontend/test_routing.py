"""Routing by model: mockers (``python -m dynamo_trio mocker``) in the test's process (over
memory streams), and real mocker processes for a worker that dies.

Which worker answered is read from each worker's own request counter
(``dynamo_component_requests_total`` on its status port): the mockers'
answers are identical by design, their counters are not.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing

from tests._memhttp import http_client
from tests._metrics import scrape
from tests._procs import start_frontend as start_frontend_process
from tests._serving import Cluster
from tests.discovery._etcd_server import free_port

from .conftest import wait_for_models

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests._procs import Proc

pytestmark = pytest.mark.slow


async def handled(status_url: str, endpoint: str = "generate") -> float:
    """Requests a worker's handler received on ``endpoint`` so far."""
    return await scrape(status_url, "dynamo_component_requests_total", dynamo_endpoint=endpoint)


class Mocker:
    """One mocker process and its status server."""

    def __init__(self, proc: Proc, status_url: str) -> None:
        self.proc = proc
        self.status_url = status_url

    async def requests(self) -> float:
        """Requests it handled so far; 0 while its status server is not listening yet
        (its model may be listed, by its other endpoint's registration, a moment sooner)."""
        try:
            return await handled(self.status_url)
        except httpx.ConnectError:
            return 0.0


async def start_mocker(
    spawn: Callable[..., Any], env: dict[str, str], *flags: str, name: str
) -> Mocker:
    port = free_port()
    proc = await spawn(
        "-m",
        "dynamo_trio",
        "mocker",
        "--ttft-ms",
        "20",
        "--inter-token-latency-ms",
        "5",
        *flags,
        env={**env, "DYN_SYSTEM_PORT": str(port)},
        name=name,
    )
    return Mocker(proc, f"http://127.0.0.1:{port}")


async def start_frontend(spawn: Callable[..., Any], env: dict[str, str]) -> str:
    _, url = await start_frontend_process(spawn, env, models={"omega"})
    return url


async def until_served(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
    """Retry until the request succeeds (every card and instance is known)."""
    with trio.fail_after(15):
        while (await http.post(path, json=body)).status_code != 200:  # noqa: ASYNC110
            await trio.sleep(0.05)  # polls another process


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_each_model_is_answered_only_by_its_own_workers(
    nursery: trio.Nursery, env: dict[str, str], autojump_clock: trio.testing.MockClock
) -> None:
    """Three mockers on one endpoint (``dynamo/mocker/generate``): alpha, beta, gamma; the
    gamma worker also serves ``alpha`` as an embeddings model (a name clash between types).
    In the test's process, over memory streams on the autojump clock: what is tested is
    where requests go, not processes."""
    cluster = Cluster(nursery, env, memory=True)
    workers: dict[str, str] = {}  # name: status URL
    for name, *flags in (
        ("alpha", "--model-name", "alpha"),
        ("beta", "--model-name", "beta"),
        ("gamma", "--model-name", "gamma", "--embedding-model-name", "alpha"),
    ):
        runtime = await cluster.mocker("--ttft-ms", "20", "--inter-token-latency-ms", "5", *flags)
        workers[name] = await cluster.status_url(runtime)
    url = await cluster.frontend()
    await wait_for_models(url, {"alpha", "beta", "gamma"}, within=15)
    embed = {"model": "alpha", "input": "hi"}
    async with http_client(url, timeout=10) as http:
        for model in ("alpha", "beta", "gamma"):
            await until_served(http, "/v1/chat/completions", chat(model))
        await until_served(http, "/v1/embeddings", embed)
        before = {name: await handled(status) for name, status in workers.items()}
        embeds_before = await handled(workers["gamma"], "embed")

        for model in ("alpha", "beta"):
            for _ in range(20):
                response = await http.post("/v1/chat/completions", json=chat(model))
                assert response.status_code == 200, response.text
                assert response.json()["model"] == model
        for _ in range(10):
            response = await http.post("/v1/embeddings", json=embed)
            assert response.status_code == 200, response.text
            assert response.json()["object"] == "list"
        completions = {"model": "alpha", "prompt": "hi", "max_tokens": 2}
        response = await http.post("/v1/completions", json=completions)
        assert response.status_code == 200, response.text

        after = {name: await handled(status) for name, status in workers.items()}
        served = {name: after[name] - before[name] for name in workers}
        assert served == {"alpha": 21, "beta": 20, "gamma": 0}, served
        assert await handled(workers["gamma"], "embed") - embeds_before == 10
        # Asked for a type its workers do not serve, a model is a clear 404.
        response = await http.post("/v1/embeddings", json={"model": "beta", "input": "hi"})
        assert response.status_code == 404, response.text
        assert "serves chat, completions" in response.json()["error"]["message"]


LOOPS = 4
"""Clients sending one request after another during the failover test."""
BEFORE_KILL = 3
"""Answers each loop has had when the worker is killed."""
AFTER_KILL = 5
"""Requests each loop sends after the kill."""


async def test_a_model_fails_over_at_once_when_one_of_its_components_dies(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    """One model on two components, one worker each; SIGKILL one worker mid-run (the
    worker processes are the point: one dies as a process does)."""
    first = await start_mocker(spawn, env, "--model-name", "omega", "--component", "c1", name="c1")
    second = await start_mocker(spawn, env, "--model-name", "omega", "--component", "c2", name="c2")
    url = await start_frontend(spawn, env)
    await wait_for_models(url, {"omega"}, within=15)
    # Each request: sent after the kill?, answered after it?, its status and text.
    results: list[tuple[bool, bool, int, str]] = []
    killed = False
    answered_before_kill: dict[int, int] = {}
    every_loop_served = trio.Event()
    body = chat("omega")
    async with http_client(url, timeout=10) as http:
        await until_served(http, "/v1/chat/completions", body)
        with trio.fail_after(15):  # both components listed, both take requests
            while not (await first.requests() and await second.requests()):
                await http.post("/v1/chat/completions", json=body)

        async def loop(index: int) -> None:
            sent_after_kill = 0
            async with http_client(url, timeout=10) as client:
                while sent_after_kill < AFTER_KILL:
                    sent_after = killed
                    sent_after_kill += sent_after
                    response = await client.post("/v1/chat/completions", json=body)
                    results.append((sent_after, killed, response.status_code, response.text))
                    if not killed:
                        answered_before_kill[index] = answered_before_kill.get(index, 0) + 1
                        if len(answered_before_kill) == LOOPS and all(
                            count >= BEFORE_KILL for count in answered_before_kill.values()
                        ):
                            every_loop_served.set()

        with trio.fail_after(60):  # a hang guard only
            async with trio.open_nursery() as nursery:
                for index in range(LOOPS):
                    nursery.start_soon(loop, index)
                # Killed mid-run: once every loop has had answers, its next requests in flight.
                await every_loop_served.wait()
                first.proc.signal(signal.SIGKILL)
                killed = True
        assert await first.proc.wait_exit() == -signal.SIGKILL
        survivor = await second.requests()

    failed = [(after, end, status, text) for after, end, status, text in results if status != 200]
    # Only a request already streaming from the killed worker may fail (its worker died
    # mid-generation: a retryable 503, since migration is off by default); everything
    # sent after the kill is answered by the other component (never "no instance").
    assert all(not sent_after and ended_after for sent_after, ended_after, _, _ in failed), failed
    assert all(status == 503 for _, _, status, _ in failed), failed
    assert all("stream ended before generation completed" in text for *_, text in failed), failed
    assert sum(sent_after for sent_after, *_ in results) == LOOPS * AFTER_KILL
    assert survivor > 0
