"""What an item costs to cross each engine bridge: items per second from a trivial engine.

Run: ``python benchmarks/engine_bridges.py [--items N] [--runs R]``.  The
engines do no work (an asyncio generator that only yields, a blocking
iterator that only yields), so the figures are the bridges' own per-item cost:
for the asyncio bridge a share of one hop from the loop's thread to trio per
batch (the items read ahead, up to its window, cross together), and with an
engine that awaits once between items ("paced": a loop pass per item, as a
real engine's step) nearer one hop per item; for the thread bridge one
``emit`` per item (the thread hands the item to trio and waits until it is
taken).  Prints the best and median of the runs for each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from functools import partial
from typing import TYPE_CHECKING

import trio

from dynamo_trio.engines import iterate_in_thread, open_asyncio_loop

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator


async def ticks(count: int) -> AsyncIterator[int]:
    for i in range(count):
        yield i


async def paced_ticks(count: int) -> AsyncIterator[int]:
    for i in range(count):
        await asyncio.sleep(0)
        yield i


def blocking_ticks(count: int) -> Iterator[int]:
    yield from range(count)


async def measure(items: int, runs: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {
        "asyncio bridge": [],
        "asyncio bridge, paced": [],
        "thread bridge": [],
    }
    async with open_asyncio_loop() as bridge:
        for _ in range(runs):
            for name, engine in (("asyncio bridge", ticks), ("asyncio bridge, paced", paced_ticks)):
                started = time.perf_counter()
                stream = bridge.stream(partial(engine, items))
                try:
                    got = len([_ async for _ in stream])
                finally:
                    await stream.aclose()
                assert got == items
                rates[name].append(items / (time.perf_counter() - started))

            started = time.perf_counter()
            blocking = iterate_in_thread(lambda should_stop: blocking_ticks(items))
            try:
                got = len([_ async for _ in blocking])
            finally:
                await blocking.aclose()
            assert got == items
            rates["thread bridge"].append(items / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rates = trio.run(measure, args.items, args.runs)
    for name, values in rates.items():
        print(
            f"{name}: best {max(values):,.0f} items/s, median {statistics.median(values):,.0f} "
            f"items/s ({1e6 / statistics.median(values):.1f} us/item), {args.runs} runs"
        )


if __name__ == "__main__":
    main()
