"""Fake engines for the bridge tests: an asyncio engine that keeps generating until it is
aborted (as vLLM's does), and a blocking token iterator that counts its steps."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator


class EngineFailure(RuntimeError):
    """What a fake engine raises when told to fail mid-stream."""


class FakeAsyncEngine:
    """Requests run in a producer task on the engine's loop, one token per loop pass,
    feeding a queue that ``generate`` reads; only ``abort`` or the end of the
    generation ends a producer.  Every attribute is touched on the loop only."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task[None]] = {}
        self.produced: dict[str, int] = {}
        self.aborted: list[str] = []
        self.events: list[str] = []  # shared with the test (list.append is atomic)

    async def generate(
        self, request_id: str, tokens: int, *, fail_at: int | None = None
    ) -> AsyncIterator[int]:
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        self.produced[request_id] = 0
        self.running[request_id] = asyncio.get_running_loop().create_task(
            self._produce(request_id, tokens, queue)
        )
        while (token := await queue.get()) is not None:
            if token == fail_at:
                raise EngineFailure(f"the engine failed at token {token}")
            yield token

    async def _produce(
        self, request_id: str, tokens: int, queue: asyncio.Queue[int | None]
    ) -> None:
        for token in range(tokens):
            await asyncio.sleep(0)  # one engine step
            self.produced[request_id] += 1
            queue.put_nowait(token)
        queue.put_nowait(None)
        del self.running[request_id]

    async def abort(self, request_id: str) -> None:
        self.events.append(f"abort {request_id}")
        self.aborted.append(request_id)
        task = self.running.pop(request_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class FakeBlockingEngine:
    """A blocking token iterator: one token per step; counts steps and live iterators."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.produced = 0
        self.active = 0
        self.threads: set[str] = set()

    def tokens(
        self,
        count: int,
        should_stop: Callable[[], bool],
        *,
        fail_at: int | None = None,
        step: Callable[[], Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        with self._lock:
            self.active += 1
            self.threads.add(threading.current_thread().name)
        try:
            for token in range(count):
                if step is not None:
                    step()
                if should_stop():
                    yield {"finish_reason": "cancelled", "produced": token}
                    return
                with self._lock:
                    self.produced += 1
                if token == fail_at:
                    raise EngineFailure(f"the engine failed at token {token}")
                yield {"token": token}
        finally:
            with self._lock:
                self.active -= 1
