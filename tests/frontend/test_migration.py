"""Request migration (``--migration-limit``): a lost worker costs the client nothing.

Real processes: a frontend and two or three model workers (the mock engine).
Workers are SIGKILLed mid-stream at random token positions, round after round,
with many streams and unary requests in flight; every request then completes
with exactly the text and usage the mock engine owes it (computed here by
running the same engine in-process), in order, nothing repeated or missing,
and the frontend counts each move once.  When no instance is left, the client
gets a clear, retryable 503 (an error event once streaming).  A request that
was cancelled is never moved, and a hang-up during a migration cancels the new
attempt.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._memhttp import http_client
from tests._serving import first_event
from tests.e2e.conftest import scrape

from ._faults import (
    LiveStream,
    expected_output,
    migrations,
    scrape_all,
    serving,
    start_frontend,
    start_worker,
    start_workers,
)
from .conftest import CHAT_BODY, assert_openai_error

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from tests.e2e.conftest import Proc

pytestmark = pytest.mark.slow

ROUNDS = 4
"""Each of the three workers is a victim once, then a restarted one (worker 0's) too."""
STREAMS = 24
UNARY = 6


def _body(
    rng: random.Random, index: int, *, stream: bool, max_tokens: int
) -> tuple[str, dict[str, Any]]:
    seed = rng.randrange(1000)
    if index % 2:
        body: dict[str, Any] = {
            **CHAT_BODY,
            "messages": [{"role": "user", "content": f"story {index}"}],
            "max_tokens": max_tokens,
            "seed": seed,
        }
        path = "/v1/chat/completions"
    else:
        body = {"model": "mock", "prompt": f"once {index}", "max_tokens": max_tokens, "seed": seed}
        path = "/v1/completions"
    if index % 5 == 0:
        body["stop"] = [" the", "fox jumps"]  # stop sequences spanning the cut
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return path, body


@dataclass
class _Round:
    """One round's requests: streams (each cut at its own token position) and unary ones."""

    streams: list[LiveStream] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)
    unary: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    expected: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    responses: dict[str, httpx.Response] = field(default_factory=dict)

    async def post(self, http: httpx.AsyncClient, request_id: str, path: str, body: Any) -> None:
        self.responses[request_id] = await http.post(
            path, json=body, headers={"x-request-id": request_id}
        )


async def _plan(
    rng: random.Random, round_index: int, streams: int = STREAMS, unary: int = UNARY
) -> _Round:
    plan = _Round()
    for index in range(streams + unary):
        is_stream = index < streams
        lengths = (40, 90) if is_stream else (80, 120)
        path, body = _body(rng, index, stream=is_stream, max_tokens=rng.randrange(*lengths))
        output = await expected_output(path, body)
        if output[1]["completion_tokens"] < lengths[0] - 10:
            del body["stop"]  # a stop sequence that comes early: no cut before it
            output = await expected_output(path, body)
        request_id = f"r{round_index}-{'s' if is_stream else 'u'}{index}"
        plan.expected[request_id] = output
        if is_stream:
            plan.streams.append(LiveStream(path, body, request_id))
            plan.cuts.append(rng.randrange(1, 25))
        else:
            plan.unary.append((request_id, path, body))
    return plan


async def _play(
    plan: _Round, http: httpx.AsyncClient, workers: list[Proc], victim: Proc
) -> tuple[set[str], set[str]]:
    """Run the round, SIGKILL ``victim`` once every stream has passed its cut; return the
    requests the victim was serving then, and those of them it had not finished (its
    finished ones may move too: the end it reported may not have reached the frontend)."""
    async with trio.open_nursery() as nursery:
        for live in plan.streams:
            nursery.start_soon(live.run, http)
        for request_id, path, body in plan.unary:
            nursery.start_soon(plan.post, http, request_id, path, body)
        # Cut each stream at its own random position, all within their first 25
        # tokens (at least 15 more to go at 10 ms each: none is finishing).
        for live, cut in zip(plan.streams, plan.cuts, strict=True):
            await live.wait_tokens(cut)
        ids = [live.request_id for live in plan.streams] + [r for r, *_ in plan.unary]
        current = [await serving(workers, request_id) for request_id in ids]
        victim.signal(signal.SIGKILL)
    await victim.wait_exit()
    with trio.fail_after(30):  # a hang guard only
        while not victim.stdout_closed:  # every event it wrote before it died
            await victim._changed.wait()
    finished = {e["id"] for e in victim.events if e["event"] == "exit"}
    served = {
        request_id for worker, request_id in zip(current, ids, strict=True) if worker is victim
    }
    return served, served - finished


def _moved(workers: list[Proc], prefix: str = "") -> set[str]:
    """The requests (ids starting ``prefix``) a worker went on with from what another had
    sent (a "start" with a continuation); each moved once at most."""
    moved = [
        e["id"]
        for worker in workers
        for e in worker.events
        if e["event"] == "start" and e["continued"] is not None and e["id"].startswith(prefix)
    ]
    assert len(moved) == len(set(moved)), moved
    return set(moved)


def _check(plan: _Round) -> int:
    """Every request of the round got exactly the output it was owed; how many there were."""
    for live in plan.streams:
        text, usage = plan.expected[live.request_id]
        assert live.error is None, (live.request_id, live.error)
        assert live.done, live.request_id
        assert live.text == text, live.request_id
        assert live.usage is not None
        assert live.usage["completion_tokens"] == usage["completion_tokens"]
        assert live.usage["prompt_tokens"] == usage["prompt_tokens"]
    for request_id, *_ in plan.unary:
        response = plan.responses[request_id]
        assert response.status_code == 200, response.text
        text, usage = plan.expected[request_id]
        choice = response.json()["choices"][0]
        got = choice["message"]["content"] if "message" in choice else choice["text"]
        assert got == text, request_id
        assert response.json()["usage"]["completion_tokens"] == usage["completion_tokens"]
    return len(plan.streams) + len(plan.unary)


async def test_sigkill_at_random_token_positions_migrates_every_request(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    rng = random.Random(11)
    workers = await start_workers(spawn, env, "worker 0", "worker 1", "worker 2")
    _, url = await start_frontend(spawn, env, "--migration-limit", "3")
    everyone = list(workers)  # the dead too: their events stay
    moved_total = 0
    on_victims = 0
    checked = 0
    restarting: trio.Event | None = None

    async def restart(index: int, done: trio.Event, name: str) -> None:
        worker, _ = await start_worker(spawn, env, name=name)
        workers[index] = worker
        everyone.append(worker)
        done.set()

    async with (
        http_client(url, timeout=30) as http,
        trio.open_nursery() as background,
    ):
        for round_index in range(ROUNDS):
            plan = await _plan(rng, round_index)
            if restarting is not None:
                await restarting.wait()  # two live workers besides the victim
            victim = workers[round_index % len(workers)]
            served, unfinished = await _play(plan, http, workers, victim)
            checked += _check(plan)
            # Every request the victim had not finished moved once, and went on from what
            # it had (a worker's "start" with a continuation, counted once); no other did.
            moved = _moved(everyone, f"r{round_index}-")
            assert unfinished <= moved <= served, (unfinished, moved, served)
            moved_total += len(moved)
            on_victims += len(unfinished)
            assert await migrations(url, migration_type="ongoing_request") == moved_total, (
                await scrape_all(url, "dynamo_frontend_model_migration_total")
            )
            # The victim comes back as a new instance, while the next round runs.
            restarting = trio.Event()
            replaced = workers.index(victim)
            background.start_soon(restart, replaced, restarting, f"worker {replaced}.{round_index}")
        assert restarting is not None
        await restarting.wait()

    # Enough were moved for the test to mean something: about a third of the requests
    # run on each round's victim, fewer when the machine is loaded (a request that
    # finished before the kill needs no move); a tenth is the floor below which the
    # test would mean little.
    assert moved_total >= ROUNDS * (STREAMS + UNARY) // 10, moved_total
    assert checked == ROUNDS * (STREAMS + UNARY)
    assert await migrations(url, migration_type="ongoing_request", reason="disconnected") == (
        moved_total
    )
    assert await scrape(url, "dynamo_frontend_requests_total", status="error") == 0
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0
    assert await scrape(url, "dynamo_frontend_inflight_requests") == 0
    print(
        f"migration: {moved_total} of {checked} requests moved mid-stream ({on_victims} were "
        f"unfinished on the killed workers), all complete"
    )


async def test_migration_with_http_workers(spawn: Callable[..., Any], env: dict[str, str]) -> None:
    """Each of ``--http-workers``' processes migrates its own requests; the counter is
    the sum over them."""
    workers = await start_workers(spawn, env, "worker 0", "worker 1", "worker 2")
    _, url = await start_frontend(spawn, env, "--migration-limit", "2", "--http-workers", "2")
    plan = await _plan(random.Random(5), 0, streams=12, unary=4)
    async with http_client(url, timeout=30) as http:
        served, unfinished = await _play(plan, http, workers, workers[0])
    assert _check(plan) == 16
    moved = _moved(workers)
    assert unfinished <= moved <= served, (unfinished, moved, served)
    assert len(moved) >= 3
    assert await migrations(url, migration_type="ongoing_request") == len(moved)
    assert await scrape(url, "dynamo_frontend_requests_total", status="error") == 0


async def test_a_request_moves_up_to_the_limit_then_fails_with_a_503(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    workers = await start_workers(spawn, env, "worker 0", "worker 1", "worker 2")
    _, url = await start_frontend(spawn, env, "--migration-limit", "1")
    body = {**CHAT_BODY, "max_tokens": 400, "stream": True, "seed": 1}
    moved = LiveStream("/v1/chat/completions", body, "moves-once")
    async with (
        http_client(url, timeout=30) as http,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(moved.run, http)
        await moved.wait_tokens(10)
        first = await serving(workers, "moves-once")
        first.signal(signal.SIGKILL)
        await moved.wait_tokens(40)
        second = await serving(workers, "moves-once")
        assert second is not first
        start = next(e for e in second.events if e.get("id") == "moves-once")
        assert start["continued"] >= 10  # it went on from what the first one had generated
        second.signal(signal.SIGKILL)  # the limit is spent: this loss is the request's error
    assert moved.error is not None, moved.text
    assert not moved.done
    error = moved.error["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "service_unavailable")
    assert "stream ended before generation completed" in error["message"]
    text, _ = await expected_output("/v1/chat/completions", body)
    assert text.startswith(moved.text)  # what did arrive was right, and in order
    assert await migrations(url, migration_type="ongoing_request") == 1
    assert await scrape(url, "dynamo_frontend_requests_total", error_type="Disconnected") == 1
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0


async def test_no_instance_left_is_a_retryable_503(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    worker, _ = await start_worker(spawn, env, name="only worker")
    _, url = await start_frontend(spawn, env, "--migration-limit", "3")
    body = {**CHAT_BODY, "max_tokens": 500, "stream": True}
    streamed = LiveStream("/v1/chat/completions", body, "s")
    async with (
        http_client(url, timeout=30) as http,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(streamed.run, http)

        async def unary() -> httpx.Response:
            return await http.post(
                "/v1/chat/completions",
                json={**CHAT_BODY, "max_tokens": 500},
                headers={"x-request-id": "u"},
            )

        responses: list[httpx.Response] = []

        async def keep(fn: Callable[[], Any]) -> None:
            responses.append(await fn())

        nursery.start_soon(keep, unary)
        await streamed.wait_tokens(5)
        await worker.wait_for("start", id="u")
        worker.signal(signal.SIGKILL)
    assert streamed.error is not None
    assert streamed.error["error"]["type"] == "service_unavailable"
    [response] = responses
    assert_openai_error(response, 503, "service_unavailable", code="service_unavailable")
    assert "stream ended before generation completed" in response.json()["error"]["message"]
    assert await migrations(url) == 0  # nowhere to go


async def test_a_hang_up_during_a_migration_cancels_the_new_attempt(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    # 30 ms a token: the stream (15 s) is still running once the second worker is up
    # (starting a worker process takes seconds on a loaded host).
    fast, _ = await start_worker(spawn, env, name="fast worker", inter_token_latency_ms=30)
    _, url = await start_frontend(spawn, env, "--migration-limit", "2")
    live = LiveStream("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 500, "stream": True}, "h")
    async with http_client(url, timeout=30) as http:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run, http)
            await live.wait_tokens(5)
            # Only now a second worker, whose every request takes 30 s to its first token.
            slow, slow_ready = await start_worker(spawn, env, name="slow worker", ttft_ms=30_000)
            await _let_the_frontend_see_the_new_worker(http, slow)
            fast.signal(signal.SIGKILL)
            started = await slow.wait_for("start", id="h", within=10)
            assert started["continued"] >= 5
            nursery.cancel_scope.cancel()  # the client hangs up while the new worker "prefills"
        exit_event = await slow.wait_for("exit", id="h", within=30)
    assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "client disconnect")
    # Two hang-ups reached the slow worker: the probe that found it, then this request.
    [probe] = [e for e in slow.events if e["event"] == "exit" and e["id"] != "h"]
    assert (probe["state"], probe["reason"]) == ("KILLED", "client disconnect")
    assert await scrape(slow_ready["status_url"], "dynamo_component_cancellation_total") == 2
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 2
    assert await migrations(url, migration_type="ongoing_request") == 1
    with trio.fail_after(30):  # a hang guard only
        while await scrape(url, "dynamo_frontend_inflight_requests"):  # noqa: ASYNC110
            await trio.sleep(0.05)


async def test_a_cancelled_request_is_never_migrated(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    # "prefill" ignores a stop: its request stays on the worker, stopped, until killed.
    first, second = await start_workers(spawn, env, "first worker", "second worker")
    _, url = await start_frontend(
        spawn, env, "--migration-limit", "3", "--on-disconnect", "stop", "--stop-grace", "30"
    )
    async with http_client(url, timeout=30) as http:
        async with trio.open_nursery() as nursery:

            async def post() -> None:
                await http.post(
                    "/v1/chat/completions",
                    json={**CHAT_BODY, "model": "prefill"},
                    headers={"x-request-id": "c"},
                )

            nursery.start_soon(post)
            holder = await serving([first, second], "c")
            nursery.cancel_scope.cancel()  # the client hangs up: the request is stopped
        with trio.fail_after(30):  # a hang guard only
            while not await scrape(url, "dynamo_frontend_model_cancellation_total"):  # noqa: ASYNC110
                await trio.sleep(0.02)
        holder.signal(signal.SIGKILL)
        other = second if holder is first else first
    # The request has ended: a migration or failover (decided while it is in flight)
    # would have kept it going on the other worker, where "prefill" never answers.
    with trio.fail_after(30):  # a hang guard only
        while await scrape(url, "dynamo_frontend_inflight_requests"):  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert not [e for e in other.events if e.get("id") == "c"]
    assert await migrations(url) == 0
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 1


@pytest.mark.parametrize("limit", [0, 2])
async def test_a_worker_shutting_down_mid_stream(
    spawn: Callable[..., Any], env: dict[str, str], limit: int
) -> None:
    """SIGTERM stops the worker's requests (reason ``shutdown``): with migration the
    stream goes on elsewhere, complete; without, it ends with a 503 error event, never
    with an ending that reads as a complete answer."""
    # 30 ms a token: the stream (9 s) is still running when the SIGTERM comes, after a
    # second worker started (seconds, on a loaded host: at 10 ms a token, one run in
    # twenty had finished the stream by then).
    first, _ = await start_worker(spawn, env, name="first worker", inter_token_latency_ms=30)
    _, url = await start_frontend(spawn, env, "--migration-limit", str(limit))
    body = {
        **CHAT_BODY,
        "max_tokens": 300,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    live = LiveStream("/v1/chat/completions", body, "t")
    async with (
        http_client(url, timeout=30) as http,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(live.run, http)
        await live.wait_tokens(5)
        second, _ = await start_worker(spawn, env, name="second worker")
        await _let_the_frontend_see_the_new_worker(http, second)
        first.signal(signal.SIGTERM)
    exit_event = await first.wait_for("exit", id="t")
    assert (exit_event["state"], exit_event["reason"]) == ("STOPPED", "shutdown")
    if limit:
        text, usage = await expected_output("/v1/chat/completions", body)
        assert live.error is None, live.error
        assert live.text == text
        assert live.usage is not None
        assert live.usage["completion_tokens"] == usage["completion_tokens"] == 300
        assert await migrations(url, reason="engine_shutdown") == 1
        await second.wait_for("exit", id="t")
    else:
        assert live.error is not None, live.text
        assert not live.done
        assert live.error["error"]["type"] == "service_unavailable"
        assert "shut down" in live.error["error"]["message"]
        assert (
            await scrape(url, "dynamo_frontend_requests_total", error_type="StreamIncomplete") == 1
        )
    assert await first.wait_exit() == 0


async def _let_the_frontend_see_the_new_worker(http: httpx.AsyncClient, worker: Proc) -> None:
    """Wait until the frontend has routed a request to ``worker``, so that the migration
    that follows has a live instance to go to: one-token probes, sent one at a time
    (round-robin over the instances the frontend lists), until one starts there.  That
    probe is hung up if still running (a worker slow to its first token), and its end
    awaited; the others ran elsewhere, or there before their start was read."""
    body = {**CHAT_BODY, "max_tokens": 1}
    sent: list[str] = []

    def started_there() -> str | None:
        return next(
            (probe for probe in sent if first_event(worker.events, "start", {"id": probe})), None
        )

    with trio.fail_after(60):  # a hang guard only
        while (found := started_there()) is None:
            probe = f"probe-{len(sent)}"
            sent.append(probe)
            async with trio.open_nursery() as nursery:

                async def send(probe: str = probe) -> None:
                    headers = {"x-request-id": probe}
                    await http.post("/v1/chat/completions", json=body, headers=headers)

                nursery.start_soon(send)
                while nursery.child_tasks and started_there() is None:
                    with trio.move_on_after(0.05):  # a checkpoint between looks
                        await worker.changed()
                nursery.cancel_scope.cancel()
        await worker.wait_for("exit", id=found, within=60)
