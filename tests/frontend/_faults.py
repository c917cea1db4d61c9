"""Helpers for the fault tests: worker and frontend processes (:mod:`tests._procs`), SSE
streams read live, and the exact output the mock engine owes each request."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from dynamo_trio import Context, llm
from dynamo_trio.mocker import MockEngine, MockerSettings
from tests._metrics import scrape, scrape_all as scrape_all
from tests._procs import Proc, start_frontend as start_frontend, start_model_worker
from tests._serving import MODELS, wait_for_models

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from tests._serving import Cluster


async def start_worker(
    spawn: Callable[..., Any],
    env: dict[str, str],
    *,
    name: str,
    inter_token_latency_ms: float = 10.0,
    ttft_ms: float = 0.0,
) -> tuple[Proc, dict[str, Any]]:
    """A model worker (``tests/e2e/_model_worker.py``), once it has registered."""
    return await start_model_worker(
        spawn, env, name=name, inter_token_latency_ms=inter_token_latency_ms, ttft_ms=ttft_ms
    )


async def frontend_here(cluster: Cluster, *flags: str) -> str:
    """:func:`start_frontend`'s frontend serving in the test's process (``cluster`` made
    with ``processes=True``), for a test that signals only workers; its URL once it
    lists every model."""
    url = await cluster.frontend(*flags)
    await wait_for_models(url, MODELS, within=20)
    return url


async def start_workers(spawn: Callable[..., Any], env: dict[str, str], *names: str) -> list[Proc]:
    """Model workers named ``names``, started side by side; returned (in that order) once
    every one has registered (a frontend started after sees them all at once)."""
    started: dict[str, Proc] = {}

    async def one(name: str) -> None:
        started[name], _ = await start_worker(spawn, env, name=name)

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    return [started[name] for name in names]


async def serving(workers: list[Proc], request_id: str) -> Proc:
    """The live worker whose handler started ``request_id`` (its current one: a request
    moves only away from a worker that died)."""
    with trio.fail_after(10):
        while True:
            for worker in workers:
                if worker.process.returncode is None and any(
                    e.get("id") == request_id for e in worker.events if e["event"] == "start"
                ):
                    return worker
            await trio.sleep(0.01)


async def expected_output(path: str, body: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The text and usage the mock engine generates for ``body`` when nothing goes wrong."""
    if path == "/v1/chat/completions":
        request = llm.parse_chat_request(body).to_engine()
    else:
        request = llm.parse_completion_request(body).to_engine()
    engine = MockEngine(MockerSettings(inter_token_latency_ms=0))
    items = [item async for item in engine.generate(request, Context())]
    generation = llm.Generation.collect(items)
    usage = generation.usage
    return generation.text, {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
    }


@dataclass
class LiveStream:
    """An SSE completion stream read as it arrives."""

    path: str
    body: dict[str, Any]
    request_id: str
    text: str = ""
    tokens: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    usage: dict[str, int] | None = None
    done: bool = False
    status: int | None = None
    changed: trio.Event = field(default_factory=trio.Event)

    def _note(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_tokens(self, count: int, *, within: float = 10.0) -> None:
        with trio.fail_after(within):
            while self.tokens < count and not self.done and self.error is None:
                await self.changed.wait()

    async def run(self, http: httpx.AsyncClient, *, headers: dict[str, str] | None = None) -> None:
        async with http.stream(
            "POST",
            self.path,
            json=self.body,
            headers={"x-request-id": self.request_id, **(headers or {})},
        ) as response:
            self.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                self.error = response.json()
                self._note()
                return
            buffer = ""
            async for chunk in response.aiter_text():
                buffer += chunk
                *blocks, buffer = buffer.split("\n\n")
                for block in blocks:
                    self._block(block)
                self._note()

    def _block(self, block: str) -> None:
        lines = block.split("\n")
        if all(line.startswith(":") for line in lines):
            return  # a keep-alive comment
        event = next((line[7:] for line in lines if line.startswith("event: ")), None)
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        if data == "[DONE]":
            self.done = True
            return
        payload = json.loads(data)
        if event == "error":
            self.error = payload
            return
        self.events.append(payload)
        if payload.get("usage"):
            self.usage = payload["usage"]
        for choice in payload.get("choices", ()):
            piece = choice.get("delta", {}).get("content") if "delta" in choice else choice["text"]
            if piece:
                self.text += piece
                self.tokens += 1


async def migrations(url: str, **labels: str) -> float:
    return await scrape(url, "dynamo_frontend_model_migration_total", **labels)
