"""Soak: at least 250 mixed requests while a worker is SIGKILLed and restarted every second.

Real processes: two stable model workers, one *chaos* worker that is SIGKILLed
and replaced every :data:`KILL_EVERY` seconds, and two frontends with
``--migration-limit 3``, one per disconnect policy (``kill``, ``stop``).  Client
tasks send, at random: complete streams and unary requests (chat and
completions, each checked against the exact text and usage the mock engine
owes it), embeddings, hang-ups at random points (before the response, and
mid-stream after a random number of events, through raw sockets so the hang-up
is a plain close), and calls from a Python runtime client that stop or kill
their work after a random number of items.

Afterwards, exactly: every request completed exactly or got a clear error (an
OpenAI error body with a 5xx status a client may retry, or the stream's error
event), never a 500, a torn stream or a wrong token; the in-flight gauges are 0
and ``/debug/requests`` is empty on every process; the frontends' file
descriptors and memory are back near their baseline; the frontends counted
exactly the hang-ups the test caused; and each stable worker counted exactly
the cancellations it saw, each one caused by the test (a hang-up, a stop, a
kill).  The chaos workers' counts die with them.
"""

from __future__ import annotations

import json
import random
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from dynamo_trio import Config, Context, DistributedRuntime, DynamoError
from tests._memhttp import TLS, http_client
from tests.e2e.conftest import scrape

from ._faults import LiveStream, expected_output, start_frontend, start_worker
from .conftest import CHAT_BODY

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from dynamo_trio.runtime import Client
    from tests.e2e.conftest import Proc

pytestmark = pytest.mark.slow

DURATION = 4.0
"""Seconds of load (longer on a slow or busy machine, see :data:`MINIMUM`)."""
TARGET = 500
"""Requests to send (fewer if :data:`DURATION` runs out first)."""
MINIMUM = 250
MINIMUM_KILLS = 3
"""The load goes on past :data:`DURATION` (up to three times it) until at least
this many requests were sent and workers killed: what the checks need to mean
something, however fast the machine is."""
CLIENTS = 24
WARM_UP = 150
"""Requests before the baseline is taken: every worker and connection in use."""
KILL_EVERY = 1.0
TOKEN_MS = 2.0
LONG = 2000
"""``max_tokens`` of the requests the test cancels: far from done when it does."""
RETRYABLE = {502, 503, 504}
"""What a clear server-side failure answers (never 500)."""
RETRYABLE_TYPES = {"service_unavailable", "timeout_error"}
"""The types of the error events that end a stream for such a failure."""


@dataclass
class Tally:
    kinds: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    hangups: int = 0
    """HTTP hang-ups before the response ended: what the frontends must count."""
    caused: set[str] = field(default_factory=set)
    """Every request id the test cancelled (hang-ups, stops, kills)."""
    expected: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)

    async def output(self, path: str, body: dict[str, Any]) -> tuple[str, dict[str, int]]:
        key = path + json.dumps(body, sort_keys=True)
        if key not in self.expected:
            self.expected[key] = await expected_output(path, body)
        return self.expected[key]

    def error(self, request_id: str, status: int | None, payload: object) -> None:
        """A failure: clear (an OpenAI error body with a status a client may retry, or
        such an error event ending a stream: ``status`` ``None``) or bad."""
        error = payload.get("error") if isinstance(payload, dict) else None
        kind = error.get("type") if isinstance(error, dict) and error.get("message") else None
        clear = kind in RETRYABLE_TYPES if status is None else kind and status in RETRYABLE
        if clear:
            self.errors[f"{status or 'event'} {kind}"] += 1
        else:
            self.bad.append(f"{request_id}: unclear failure {status} {payload!r}"[:300])


def _text_body(rng: random.Random, *, stream: bool, max_tokens: int) -> tuple[str, dict[str, Any]]:
    prompt = f"soak {rng.randrange(40)}"
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body: dict[str, Any] = {**CHAT_BODY, "messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"model": "mock", "prompt": prompt}
    body["max_tokens"] = max_tokens
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return path, body


async def complete_stream(
    tally: Tally, rng: random.Random, http: httpx.AsyncClient, request_id: str
) -> None:
    path, body = _text_body(rng, stream=True, max_tokens=rng.choice((8, 16, 32)))
    live = LiveStream(path, body, request_id)
    try:
        await live.run(http)
    except httpx.HTTPError as exc:
        tally.bad.append(f"{request_id}: {exc!r}")
        return
    if live.error is not None:
        tally.error(request_id, None if live.status == 200 else live.status, live.error)
        return
    text, usage = await tally.output(path, body)
    if (
        not live.done
        or live.text != text
        or (live.usage or {}).get("completion_tokens") != (usage["completion_tokens"])
    ):
        tally.bad.append(f"{request_id}: stream {live.done=} {live.text!r} != {text!r}")
        return
    tally.completed += 1


async def complete_unary(
    tally: Tally, rng: random.Random, http: httpx.AsyncClient, request_id: str
) -> None:
    path, body = _text_body(rng, stream=False, max_tokens=rng.choice((8, 16, 32)))
    try:
        response = await http.post(path, json=body, headers={"x-request-id": request_id})
    except httpx.HTTPError as exc:
        tally.bad.append(f"{request_id}: {exc!r}")
        return
    if response.status_code != 200:
        tally.error(request_id, response.status_code, response.json())
        return
    text, usage = await tally.output(path, body)
    choice = response.json()["choices"][0]
    got = choice["message"]["content"] if "message" in choice else choice["text"]
    if got != text or response.json()["usage"]["completion_tokens"] != usage["completion_tokens"]:
        tally.bad.append(f"{request_id}: unary {got!r} != {text!r}")
        return
    tally.completed += 1


async def embedding(
    tally: Tally, rng: random.Random, http: httpx.AsyncClient, request_id: str
) -> None:
    body = {"model": "mock-embed", "input": [f"soak {rng.randrange(40)}"], "dimensions": 8}
    try:
        response = await http.post(
            "/v1/embeddings", json=body, headers={"x-request-id": request_id}
        )
    except httpx.HTTPError as exc:
        tally.bad.append(f"{request_id}: {exc!r}")
        return
    if response.status_code != 200:
        tally.error(request_id, response.status_code, response.json())
        return
    if len(response.json()["data"][0]["embedding"]) != 8:
        tally.bad.append(f"{request_id}: embedding {response.text[:200]}")
        return
    tally.completed += 1


async def hang_up(tally: Tally, rng: random.Random, url: str, request_id: str) -> None:
    """Send a long request over a raw socket and close it: before the response (after
    a random moment), or mid-stream (after a random number of SSE events)."""
    stream_it = rng.random() < 0.6
    path, body = _text_body(rng, stream=stream_it, max_tokens=LONG)
    events = rng.randrange(1, 12) if stream_it and rng.random() < 0.7 else 0
    host, port = url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nx-request-id: {request_id}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        await stream.send_all(head + data)
        if not events:
            await trio.sleep(rng.uniform(0, 0.15))
            tally.caused.add(request_id)
            tally.hangups += 1
            return
        received = b""
        with trio.move_on_after(20):
            while received.count(b"\ndata: ") < events:
                got = await stream.receive_some(65536)
                if not got:
                    break
                received += got
        if not received.startswith(b"HTTP/1.1 200") or b"event: error" in received:
            tally.bad.append(f"{request_id}: hang-up stream got {received[:300]!r}")
            return
        tally.caused.add(request_id)
        tally.hangups += 1
    finally:
        stream.socket.close()  # a plain close: the hang-up
        await trio.lowlevel.checkpoint()


async def python_call(tally: Tally, rng: random.Random, client: Client, request_id: str) -> None:
    """A call from a Python runtime client: complete, or stopped or killed after some items."""
    mode = rng.choice(("complete", "stop", "kill"))
    after = rng.randrange(1, 10)
    context = Context(request_id)
    request = {
        "model": "mock",
        "request_type": "completion",
        "prompt": f"soak {rng.randrange(40)}",
        "max_tokens": 16 if mode == "complete" else LONG,
    }
    items: list[Any] = []
    try:
        async with await client.round_robin(request, context=context) as stream:
            async for item in stream:
                items.append(item.data())
                if len(items) == after and mode != "complete":
                    tally.caused.add(request_id)
                    if mode == "stop":
                        context.stop_generating()  # its drain still arrives
                    else:
                        context.kill()
    except DynamoError as exc:  # the chaos worker died under it (no migration here)
        tally.errors[f"python {exc.error_type}"] += 1
        return
    finish = items[-1].get("finish_reason") if items else None
    if mode == "complete":
        ok = finish == "length" and len(items) == 16
    else:
        # Stopped: its drain ends with "cancelled" (or nothing, if the worker died
        # meanwhile: a stopped call ends quietly).  Killed: nothing more arrives.
        ok = len(items) >= after and finish in (None, "cancelled" if mode == "stop" else None)
    if ok:
        tally.completed += 1
    else:
        tally.bad.append(f"{request_id}: python {mode} after {after}: {items[-2:]!r}")


async def _gauges(url: str, name: str) -> float:
    return await scrape(url, name)


async def _settled(urls: list[str], name: str) -> None:
    with trio.fail_after(15):
        for url in urls:
            while await _gauges(url, name):  # noqa: ASYNC110
                await trio.sleep(0.05)


def _trail(bad: list[str], procs: list[Proc]) -> list[str]:
    """What every process logged or reported about the requests in ``bad``: the
    lines of their stderr and the events that name them (to tell where one stalled)."""
    ids = {entry.split(":", 1)[0] for entry in bad}
    named = re.compile("|".join(rf"{re.escape(request_id)}(?!\d)" for request_id in ids))
    found = []
    for proc in procs:
        for line in proc.stderr.decode(errors="replace").splitlines():
            if named.search(line):
                found.append(f"{proc.name}: {line}"[:500])
        found += [f"{proc.name}: {event}" for event in proc.events if event.get("id") in ids]
    return found


def _usage(pid: int) -> tuple[int, int]:
    """(open file descriptors, resident KiB) of a process."""
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return fds, rss


async def test_soak(spawn: Callable[..., Any], env: dict[str, str]) -> None:
    rng = random.Random(2026)
    # Liveness bounds of a real deployment, not the other tests' 1 s: this test process
    # is itself loaded (two dozen clients), and a stall of its own must not read as a
    # fault of the system (a SIGKILLed worker's connections close at once anyway).
    env = {
        **env,
        "DYN_HEARTBEAT_INTERVAL_SECS": "1",
        "DYN_HEARTBEAT_TIMEOUT_SECS": "5",
        "DYN_LEASE_TTL_SECS": "5",
    }
    config = Config.from_env(env)
    # Every process starts at once (the frontends list the models once the workers are up).
    procs: dict[str, Any] = {}

    async def keep(name: str, start: Awaitable[Any]) -> None:
        procs[name] = await start

    flags = ("--migration-limit", "3")
    async with trio.open_nursery() as nursery:
        for name in ("stable 0", "stable 1", "chaos 0"):
            nursery.start_soon(
                keep, name, start_worker(spawn, env, name=name, inter_token_latency_ms=TOKEN_MS)
            )
        nursery.start_soon(keep, "kill", start_frontend(spawn, env, *flags))
        nursery.start_soon(
            keep,
            "stop",
            start_frontend(spawn, env, *flags, "--on-disconnect", "stop", "--stop-grace", "5"),
        )
    stable: list[tuple[Proc, dict[str, Any]]] = [procs["stable 0"], procs["stable 1"]]
    chaos: list[tuple[Proc, dict[str, Any]]] = [procs["chaos 0"]]
    (kill_frontend, kill_url), (stop_frontend, stop_url) = procs["kill"], procs["stop"]
    frontends = {kill_url: kill_frontend, stop_url: stop_frontend}
    tally = Tally()

    async with DistributedRuntime(config) as runtime:
        client = await runtime.namespace("dynamo").component("mock").endpoint("generate").client()
        await client.wait_for_instances()

        async def load(
            count: int, deadline: float, *, enough: Callable[[], bool] = lambda: True
        ) -> None:
            """Send up to ``count`` requests until ``deadline``, and on (past ``count``, and
            past ``deadline`` up to three times as long) until ``enough()``."""
            sent = 0
            start = trio.current_time()
            cap = start + 3 * (deadline - start)

            def going() -> bool:
                now = trio.current_time()
                if not enough():
                    return now < cap
                return sent < count and now < deadline

            kinds: list[tuple[str, float]] = [
                ("stream", 0.3),
                ("unary", 0.2),
                ("embedding", 0.05),
                ("hang-up", 0.3),
                ("python", 0.15),
            ]
            names, weights = zip(*kinds, strict=True)

            async def one_client(index: int) -> None:
                nonlocal sent
                limits = httpx.Limits(max_connections=4)
                async with (
                    http_client(kill_url, timeout=30, limits=limits) as to_kill,
                    http_client(stop_url, timeout=30, limits=limits) as to_stop,
                ):
                    while going():
                        sent += 1
                        request_id = f"soak-{tally.kinds.total()}-{index}"
                        kind = rng.choices(names, weights)[0]
                        tally.kinds[kind] += 1
                        http = to_kill if rng.random() < 0.5 else to_stop
                        run: Awaitable[None]
                        if kind == "stream":
                            run = complete_stream(tally, rng, http, request_id)
                        elif kind == "unary":
                            run = complete_unary(tally, rng, http, request_id)
                        elif kind == "embedding":
                            run = embedding(tally, rng, http, request_id)
                        elif kind == "hang-up":
                            run = hang_up(tally, rng, str(http.base_url).rstrip("/"), request_id)
                        else:
                            run = python_call(tally, rng, client, request_id)
                        await run

            async with trio.open_nursery() as nursery:
                for index in range(CLIENTS):
                    nursery.start_soon(one_client, index)

        # Warm up (every worker and connection in use), then take the baseline.
        await load(WARM_UP, trio.current_time() + 20)
        await _settled(list(frontends), "dynamo_frontend_inflight_requests")
        baseline = {url: _usage(proc.process.pid) for url, proc in frontends.items()}
        warm = tally.kinds.total()

        kills = 0
        load_done = trio.Event()

        async def chaos_monkey() -> None:
            nonlocal kills
            while True:
                with trio.move_on_after(KILL_EVERY):
                    await load_done.wait()
                if load_done.is_set():
                    return
                chaos[-1][0].signal(signal.SIGKILL)
                kills += 1
                chaos.append(
                    await start_worker(
                        spawn, env, name=f"chaos {kills}", inter_token_latency_ms=TOKEN_MS
                    )
                )

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(chaos_monkey)
            await load(
                TARGET,
                started + DURATION,
                enough=lambda: tally.kinds.total() - warm >= MINIMUM and kills >= MINIMUM_KILLS,
            )
            load_done.set()
        took = trio.current_time() - started

    soaked = tally.kinds.total() - warm
    urls = list(frontends)
    workers = [ready["status_url"] for _, ready in (*stable, chaos[-1])]
    await _settled(urls, "dynamo_frontend_inflight_requests")
    await _settled(workers, "dynamo_component_inflight_requests")
    after = {url: _usage(proc.process.pid) for url, proc in frontends.items()}
    print(
        f"soak: {soaked} requests in {took:.1f}s ({soaked / took:.0f}/s) with {kills} worker "
        f"kills; kinds {dict(tally.kinds)}; completed {tally.completed}; clear errors "
        f"{dict(tally.errors)}; hang-ups {tally.hangups}; frontends (fds, RSS KiB) "
        f"before {baseline} after {after}"
    )

    everyone = [*frontends.values(), *(proc for proc, _ in (*stable, *chaos))]
    assert not tally.bad, (tally.bad[:10], _trail(tally.bad[:10], everyone))
    assert tally.completed + tally.errors.total() + tally.hangups == tally.kinds.total()
    assert soaked >= MINIMUM, soaked
    assert kills >= MINIMUM_KILLS, kills

    async with httpx.AsyncClient(verify=TLS, timeout=5) as http:
        for url in (*urls, *workers):
            assert (await http.get(f"{url}/debug/requests")).json() == [], url
    for url in urls:
        assert await scrape(url, "dynamo_frontend_inflight_requests") == 0
        assert await scrape(url, "dynamo_frontend_requests_total", error_type="internal") == 0
        fds, rss = after[url]
        base_fds, base_rss = baseline[url]
        assert fds <= base_fds + 8, (url, base_fds, fds)
        assert rss <= base_rss + 16 * 1024, (url, base_rss, rss)
    for status in workers:
        assert await scrape(status, "dynamo_component_inflight_requests") == 0

    # The worker kills met requests in flight, which moved.
    moved = sum([await scrape(url, "dynamo_frontend_model_migration_total") for url in urls])
    assert moved > 0
    # The frontends counted exactly the hang-ups the test caused.
    cancelled = sum([await scrape(url, "dynamo_frontend_model_cancellation_total") for url in urls])
    assert cancelled == tally.hangups

    # Each stable worker counted exactly the cancellations it saw, each caused by the test.
    for worker, ready in stable:
        seen = [
            e for e in worker.events if e["event"] == "exit" and e["state"] in ("STOPPED", "KILLED")
        ]
        assert {e["id"] for e in seen} <= tally.caused
        counted = await scrape(ready["status_url"], "dynamo_component_cancellation_total")
        assert counted == len(seen), (worker.name, counted, len(seen))
