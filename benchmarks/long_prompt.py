"""A long prompt beside a running stream: does tokenizing it hold the stream up?

Run (as ``vllm_side_by_side.py``, whose helpers it shares): ``python
benchmarks/long_prompt.py --model DIR [--rounds N] [--words N]``.

The vLLM worker behind the frontend and vLLM's own OpenAI server are up at once;
rounds alternate between them.  A round starts a streamed chat (``ignore_eos``),
waits 1.5 s, then sends a completion whose prompt is ``--words`` words (over the
model's context: refused once tokenized) and prints the stream's longest gap between
two chunks before and while that request ran, and how long the request took.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
import trio
from vllm_side_by_side import (
    commands,
    environment,
    free_port,
    remove_directories,
    start,
    stop,
    wait_ready,
)


async def one_round(http: httpx.AsyncClient, url: str, words: int) -> tuple[float, float, float]:
    """(the stream's longest gap before, and during, the long request; its time), seconds."""
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    chat |= {"max_tokens": 1900, "ignore_eos": True}
    long = {
        "model": "tiny",
        "prompt": "hello tell me a long story " * (words // 6),
        "max_tokens": 1,
    }
    gaps: list[float] = []
    marks: list[int] = []

    async def stream() -> None:
        last = None
        async with http.stream("POST", f"{url}/v1/chat/completions", json=chat) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await trio.sleep(1.5)
        marks.append(len(gaps))
        started = time.perf_counter()
        await http.post(f"{url}/v1/completions", json=long)
        took = time.perf_counter() - started
        await trio.sleep(0.2)
        marks.append(len(gaps))
        nursery.cancel_scope.cancel()
    before, while_long = gaps[: marks[0]], gaps[marks[0] : marks[1]]
    return max(before, default=0.0), max(while_long, default=0.0), took


async def main(args: argparse.Namespace) -> None:
    env = environment()
    frontend_port, vllm_port = free_port(), free_port()
    argvs = commands(args.model, frontend_port, vllm_port)
    systems = {
        "dynamo-trio": f"http://127.0.0.1:{frontend_port}",
        "vLLM server": f"http://127.0.0.1:{vllm_port}",
    }
    results: dict[str, list[tuple[float, float, float]]] = {system: [] for system in systems}
    processes: list[trio.Process] = []
    try:
        for argv in argvs.values():
            processes.append(await start(argv, env))
        async with httpx.AsyncClient(timeout=120) as http:
            for url in systems.values():
                await wait_ready(http, url)
            for round_ in range(args.rounds):
                for system, url in systems.items():
                    figures = await one_round(http, url, args.words)
                    results[system].append(figures)
                    before, during, took = figures
                    print(
                        f"round {round_ + 1} {system:12} longest gap before {before * 1e3:7.1f}"
                        f" ms, during {during * 1e3:7.1f} ms; long request {took:5.2f} s",
                        flush=True,
                    )
    finally:
        await stop(processes)
        remove_directories(env)
    print(f"\nmedians over {args.rounds} rounds ({args.words} words):")
    for system, rows in results.items():
        before, during, took = (statistics.median(column) for column in zip(*rows, strict=True))
        print(
            f"  {system:12} longest gap before {before * 1e3:.1f} ms, during {during * 1e3:.1f} ms;"
            f" long request {took:.2f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=480_000)
    trio.run(main, parser.parse_args())
