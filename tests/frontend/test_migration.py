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
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import scrape

from ._faults import (
    LiveStream,
    expected_output,
    migrations,
    serving,
    start_frontend,
    start_worker,
)
from .conftest import CHAT_BODY, assert_openai_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.e2e.conftest import Proc

pytestmark = pytest.mark.slow

ROUNDS = 16
STREAMS = 24
UNARY = 4


def _body(rng: random.Random, index: int, *, stream: bool, max_tokens: int) -> tuple[str, dict]:
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


async def test_sigkill_at_random_token_positions_migrates_every_request(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    rng = random.Random(11)
    workers: list[Proc] = []
    for index in range(3):
        worker, _ = await start_worker(spawn, env, name=f"worker {index}")
        workers.append(worker)
    _, url = await start_frontend(spawn, env, "--migration-limit", "3")
    moved_total = 0
    checked = 0
    restarting: trio.Event | None = None
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as http,
        trio.open_nursery() as background,
    ):
        for round_index in range(ROUNDS):
            if restarting is not None:
                await restarting.wait()  # two live workers besides the victim
            victim = workers[round_index % len(workers)]
            streams: list[LiveStream] = []
            cuts: list[int] = []
            expected: dict[str, tuple[str, dict[str, int]]] = {}
            unary: list[tuple[str, str, dict[str, Any]]] = []
            for index in range(STREAMS + UNARY):
                is_stream = index < STREAMS
                lengths = (40, 90) if is_stream else (80, 120)
                path, body = _body(rng, index, stream=is_stream, max_tokens=rng.randrange(*lengths))
                output = await expected_output(path, body)
                if output[1]["completion_tokens"] < lengths[0] - 10:
                    del body["stop"]  # a stop sequence that comes early: no cut before it
                    output = await expected_output(path, body)
                request_id = f"r{round_index}-{'s' if is_stream else 'u'}{index}"
                expected[request_id] = output
                if is_stream:
                    streams.append(LiveStream(path, body, request_id))
                    cuts.append(rng.randrange(1, 25))
                else:
                    unary.append((request_id, path, body))
            unary_results: dict[str, httpx.Response] = {}

            async def post(request_id: str, path: str, body: dict[str, Any]) -> None:
                unary_results[request_id] = await http.post(
                    path, json=body, headers={"x-request-id": request_id}
                )

            async with trio.open_nursery() as nursery:
                for live in streams:
                    nursery.start_soon(live.run, http)
                for request_id, path, body in unary:
                    nursery.start_soon(post, request_id, path, body)
                # Cut each stream at its own random position, all within their first
                # 25 tokens (at least 15 more to go at 10 ms each: none is finishing).
                for live, cut in zip(streams, cuts, strict=True):
                    await live.wait_tokens(cut)
                current = [await serving(workers, live.request_id) for live in streams]
                current += [await serving(workers, request_id) for request_id, *_ in unary]
                on_victim = sum(worker is victim for worker in current)
                victim.signal(signal.SIGKILL)
            moved_total += on_victim

            for live in streams:
                text, usage = expected[live.request_id]
                assert live.error is None, (live.request_id, live.error)
                assert live.done, live.request_id
                assert live.text == text, live.request_id
                assert live.usage is not None
                assert live.usage["completion_tokens"] == usage["completion_tokens"]
                assert live.usage["prompt_tokens"] == usage["prompt_tokens"]
                checked += 1
            for request_id, path, body in unary:
                response = unary_results[request_id]
                assert response.status_code == 200, response.text
                text, usage = expected[request_id]
                choice = response.json()["choices"][0]
                got = choice["message"]["content"] if "message" in choice else choice["text"]
                assert got == text, request_id
                assert response.json()["usage"]["completion_tokens"] == usage["completion_tokens"]
                checked += 1
            assert await migrations(url, migration_type="ongoing_request") == moved_total

            # The victim comes back as a new instance, while the next round runs.
            restarting = trio.Event()
            replaced = workers.index(victim)

            async def restart(index: int, done: trio.Event, name: str) -> None:
                worker, _ = await start_worker(spawn, env, name=name)
                workers[index] = worker
                done.set()

            background.start_soon(restart, replaced, restarting, f"worker {replaced}.{round_index}")
        assert restarting is not None
        await restarting.wait()

    assert moved_total >= ROUNDS * (STREAMS + UNARY) // 4, moved_total  # enough were moved
    assert checked == ROUNDS * (STREAMS + UNARY)
    assert await migrations(url, migration_type="ongoing_request", reason="disconnected") == (
        moved_total
    )
    assert await scrape(url, "dynamo_frontend_requests_total", status="error") == 0
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0
    assert await scrape(url, "dynamo_frontend_inflight_requests") == 0
    print(f"migration: {moved_total} of {checked} requests moved mid-stream, all complete")


async def test_a_request_moves_up_to_the_limit_then_fails_with_a_503(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    workers = [
        (await start_worker(spawn, env, name=f"worker {index}"))[0] for index in range(3)
    ]
    _, url = await start_frontend(spawn, env, "--migration-limit", "1")
    body = {**CHAT_BODY, "max_tokens": 400, "stream": True, "seed": 1}
    moved = LiveStream("/v1/chat/completions", body, "moves-once")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http, trio.open_nursery() as nursery:
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
    streamed = LiveStream("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 500, "stream": True}, "s")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http, trio.open_nursery() as nursery:
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
    fast, _ = await start_worker(spawn, env, name="fast worker")
    _, url = await start_frontend(spawn, env, "--migration-limit", "2")
    live = LiveStream("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 500, "stream": True}, "h")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run, http)
            await live.wait_tokens(5)
            # Only now a second worker, whose every request takes 30 s to its first token.
            slow, slow_ready = await start_worker(
                spawn, env, name="slow worker", ttft_ms=30_000
            )
            await _wait_listed(url, 2)
            fast.signal(signal.SIGKILL)
            started = await slow.wait_for("start", id="h", within=10)
            assert started["continued"] >= 5
            nursery.cancel_scope.cancel()  # the client hangs up while the new worker "prefills"
        exit_event = await slow.wait_for("exit", id="h", within=5)
    assert (exit_event["state"], exit_event["reason"]) == ("KILLED", "client disconnect")
    assert await scrape(slow_ready["status_url"], "dynamo_component_cancellation_total") == 1
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 1
    assert await migrations(url, migration_type="ongoing_request") == 1
    with trio.fail_after(5):
        while await scrape(url, "dynamo_frontend_inflight_requests"):  # noqa: ASYNC110
            await trio.sleep(0.05)


async def test_a_cancelled_request_is_never_migrated(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    # "prefill" ignores a stop: its request stays on the worker, stopped, until killed.
    first, _ = await start_worker(spawn, env, name="first worker")
    second, _ = await start_worker(spawn, env, name="second worker")
    _, url = await start_frontend(
        spawn, env, "--migration-limit", "3", "--on-disconnect", "stop", "--stop-grace", "30"
    )
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
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
        with trio.fail_after(5):
            while not await scrape(url, "dynamo_frontend_model_cancellation_total"):  # noqa: ASYNC110
                await trio.sleep(0.02)
        holder.signal(signal.SIGKILL)
        other = second if holder is first else first
        await trio.sleep(1.0)  # time enough for a (wrong) migration or failover
    assert not [e for e in other.events if e.get("id") == "c"]
    assert await migrations(url) == 0
    with trio.fail_after(5):
        while await scrape(url, "dynamo_frontend_inflight_requests"):  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 1


@pytest.mark.parametrize("limit", [0, 2])
async def test_a_worker_shutting_down_mid_stream(
    spawn: Callable[..., Any], env: dict[str, str], limit: int
) -> None:
    """SIGTERM stops the worker's requests (reason ``shutdown``): with migration the
    stream goes on elsewhere, complete; without, it ends with a 503 error event, never
    with an ending that reads as a complete answer."""
    first, _ = await start_worker(spawn, env, name="first worker")
    _, url = await start_frontend(spawn, env, "--migration-limit", str(limit))
    body = {**CHAT_BODY, "max_tokens": 300, "stream": True, "stream_options": {"include_usage": True}}
    live = LiveStream("/v1/chat/completions", body, "t")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http, trio.open_nursery() as nursery:
        nursery.start_soon(live.run, http)
        await live.wait_tokens(5)
        second, _ = await start_worker(spawn, env, name="second worker")
        await _wait_listed(url, 2)
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
        assert await scrape(
            url, "dynamo_frontend_requests_total", error_type="StreamIncomplete"
        ) == 1
    assert await first.wait_exit() == 0


async def _wait_listed(url: str, instances: int) -> None:
    """Give the frontend time to see a worker that just registered (the tests' file
    discovery is polled every 50 ms; a migration also waits for a card's instance)."""
    del url, instances
    await trio.sleep(0.5)
