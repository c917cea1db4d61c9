"""The LLM examples behind a real frontend, each program its own process, as their READMEs say.

- ``examples/llm``: the toy engine's worker; the frontend serves its text, and a
  client hanging up mid-stream kills the work on the worker.
- ``examples/disaggregated``: frontend -> decode worker -> prefill worker; a
  client hanging up during prefill cancels the prefill worker's work through
  the linked contexts, under one request id, in all three processes.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import openai
import pytest
import trio

from dynamo_trio import Context
from dynamo_trio.llm import SamplingParams, validate_generate_request
from tests._memhttp import http_client, openai_client_leaves_generators
from tests._procs import start_frontend as start_frontend_process

from .conftest import ROOT, scrape as metric

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from .conftest import Proc

pytestmark = pytest.mark.slow

LLM = ROOT / "examples" / "llm"
DISAGGREGATED = ROOT / "examples" / "disaggregated"
QUESTION: Any = [{"role": "user", "content": "Tell me about the ferry."}]
DISAGG_ANSWER = (
    "The cache arrived from prefill, and decode carried on one token at a time "
    "until its answer was long enough."
)


def load_toy_engine() -> ModuleType:
    """``examples/llm/engine.py``, imported from its path (the examples are not a package)."""
    spec = importlib.util.spec_from_file_location("toy_engine", LLM / "engine.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def expected_toy_text(request: Any) -> tuple[str, dict[str, Any]]:
    """What the toy engine generates for ``request``: its text and its last item."""
    engine = load_toy_engine().ToyEngine(prefill_ms_per_token=0, decode_ms_per_token=0)
    pieces, last = [], None
    async for item in engine.generate(validate_generate_request(request), Context()):
        pieces.append(item.get("text", ""))
        last = item
    assert last is not None
    return "".join(pieces), last


async def wait_for_line(proc: Proc, *texts: str, within: float = 10.0) -> str:
    """The first line ``proc`` printed that contains every one of ``texts``."""
    with trio.fail_after(within):
        while True:
            for line in proc.stdout_lines:
                if all(text in line for text in texts):
                    return line
            if proc.stdout_closed:
                raise AssertionError(
                    f"{proc.name} ended without printing {texts!r}:\n"
                    + "\n".join(proc.stdout_lines)
                    + proc.stderr.decode(errors="replace")[-2000:]
                )
            await proc._changed.wait()


async def start_frontend(
    spawn: Callable[..., Any], env: dict[str, str], model: str, *flags: str
) -> str:
    """``python -m dynamo_trio.frontend --http-port 0 *flags``; its URL once it lists ``model``
    (the only model of the example)."""
    _, url = await start_frontend_process(spawn, env, *flags, models={model})
    return url


async def status_url(proc: Proc, who: str) -> str:
    """The worker's status server (``DYN_SYSTEM_PORT=0`` in the tests' environment)."""
    line = await wait_for_line(proc, f"{who}: metrics at ")
    return line.rsplit(" ", 1)[1].removesuffix("/metrics")


async def open_raw(url: str, path: str, body: dict[str, Any], request_id: str) -> Any:
    """POST on a raw socket and return the socket stream, response unread."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    )
    await stream.send_all(head.encode() + data)
    return stream


async def stop_gracefully(proc: Proc, last_line: str) -> None:
    proc.signal(signal.SIGTERM)
    assert await proc.wait_exit() == 0
    await wait_for_line(proc, last_line)


# ---------------------------------------------------------------------------- examples/llm


@openai_client_leaves_generators
async def test_toy_worker_serves_deterministic_text(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    worker = await spawn(
        str(LLM / "worker.py"), "--decode-ms-per-token", "2", env=env, name="toy worker"
    )
    url = await start_frontend(spawn, env, "toy")  # beside the worker: it lists the model
    await wait_for_line(worker, "Toy: serving model 'toy' at dynamo/toy/generate")
    text, last = await expected_toy_text(
        SamplingParams(max_tokens=24).chat_request("toy", QUESTION)
    )
    assert last["finish_reason"] == "length"
    assert text.startswith("The lamps on the ferryman writes in twenty slow minutes.")  # README

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client:
        reply = await client.chat.completions.create(
            model="toy", messages=QUESTION, max_tokens=24, extra_headers={"x-request-id": "unary"}
        )
        assert reply.choices[0].message.content == text
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage is not None
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (8, 24)

        stream = await client.chat.completions.create(
            model="toy", messages=QUESTION, max_tokens=24, stream=True
        )
        streamed = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        assert "".join(streamed) == text
        assert len([piece for piece in streamed if piece]) == 24  # one chunk per token

    completion, _ = await expected_toy_text(
        SamplingParams(max_tokens=12).completion_request("toy", "The ferryman")
    )
    async with http_client(url, timeout=10) as http:
        response = await http.post(
            "/v1/completions", json={"model": "toy", "prompt": "The ferryman", "max_tokens": 12}
        )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == completion

    await wait_for_line(worker, "Toy: started unary (8 prompt tokens)")
    await wait_for_line(worker, "Toy: finished unary (length, 24 tokens)")
    await stop_gracefully(worker, "Toy: shut down")


@pytest.mark.parametrize("policy", ["kill", "stop"])
async def test_toy_worker_is_cancelled_when_a_stream_hangs_up(
    spawn: Callable[..., Any], env: dict[str, str], policy: str
) -> None:
    worker = await spawn(
        str(LLM / "worker.py"), "--decode-ms-per-token", "20", env=env, name="toy worker"
    )
    url = await start_frontend(spawn, env, "toy", "--on-disconnect", policy)
    worker_status = await status_url(worker, "Toy")
    request_id = f"toy-{uuid.uuid4()}"
    body = {
        "model": "toy",
        "messages": QUESTION,
        "stream": True,
        "max_tokens": 10_000,
        "ignore_eos": True,
    }
    stream = await open_raw(url, "/v1/chat/completions", body, request_id)
    received = b""
    with trio.fail_after(10):
        while received.count(b"data:") < 4:  # the role chunk, then three tokens
            chunk = await stream.receive_some(65536)
            assert chunk, received
            received += chunk
    await stream.aclose()
    # kill: cancelled mid-await; stop: the engine drains (a last "cancelled" item, usage).
    outcome = "killed" if policy == "kill" else "stopped"
    # (the reason, not a time, says it was the hang-up: a bound here is a hang guard)
    line = await wait_for_line(worker, f"Toy: {outcome} {request_id} after", within=15)
    assert line.endswith("tokens (client disconnect)"), line
    labels = {"model": "toy", "endpoint": "chat_completions", "request_type": "stream"}
    assert await metric(url, "dynamo_frontend_model_cancellation_total", **labels) == 1
    assert await metric(worker_status, "dynamo_component_cancellation_total") == 1


# ---------------------------------------------------------------------------- disaggregated


async def start_disaggregated(
    spawn: Callable[..., Any], env: dict[str, str], *prefill_flags: str
) -> tuple[Proc, Proc, str]:
    """Prefill worker, decode worker, frontend: the three commands of the README, started
    at once (the decode worker serves once it sees a prefill worker, the frontend lists
    the model once the decode worker serves it)."""
    prefill = await spawn(
        str(DISAGGREGATED / "prefill_worker.py"), *prefill_flags, env=env, name="prefill"
    )
    decode = await spawn(
        str(DISAGGREGATED / "decode_worker.py"),
        "--decode-ms-per-token",
        "2",
        env=env,
        name="decode",
    )
    url = await start_frontend(spawn, env, "disagg")
    await wait_for_line(prefill, "Prefill: serving dynamo/prefill/generate")
    await wait_for_line(decode, "Decode: serving model 'disagg' at dynamo/decode/generate")
    return prefill, decode, url


async def test_disaggregated_request_prefills_then_decodes(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    prefill, decode, url = await start_disaggregated(spawn, env, "--prefill-ms-per-token", "20")
    request_id = f"disagg-{uuid.uuid4()}"
    async with http_client(url, timeout=10) as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": "disagg", "messages": QUESTION},
            headers={"x-request-id": request_id},
        )
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["choices"][0]["message"]["content"] == DISAGG_ANSWER
    assert reply["choices"][0]["finish_reason"] == "stop"
    # "user: Tell me about the ferry.\n" is 8 tokens, all in one 16-token KV block.
    assert reply["usage"]["prompt_tokens"] == 8
    assert reply["usage"]["completion_tokens"] == 22

    await wait_for_line(prefill, f"Prefill: started {request_id} (8 tokens")
    await wait_for_line(prefill, f"Prefill: done {request_id}")
    await wait_for_line(decode, f"Decode: waiting for prefill {request_id}")
    await wait_for_line(decode, f"Decode: prefill done {request_id} (8 tokens in 1 KV blocks")
    await wait_for_line(decode, f"Decode: done {request_id} (stop, 22 tokens)")
    assert not any("cancelled" in line for line in prefill.stdout_lines + decode.stdout_lines)
    assert await metric(url, "dynamo_frontend_model_cancellation_total") == 0

    await stop_gracefully(decode, "Decode: shut down")
    await stop_gracefully(prefill, "Prefill: shut down")


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_hang_up_during_prefill_cancels_prefill_and_decode(
    spawn: Callable[..., Any], env: dict[str, str], stream: bool
) -> None:
    # 8 prompt tokens at 1 s each: the client hangs up long before the prefill is done.
    prefill, decode, url = await start_disaggregated(spawn, env, "--prefill-ms-per-token", "1000")
    request_id = f"hang-up-{uuid.uuid4()}"
    body = {"model": "disagg", "messages": QUESTION, "stream": stream}
    client = await open_raw(url, "/v1/chat/completions", body, request_id)
    await wait_for_line(prefill, f"Prefill: started {request_id}")
    await wait_for_line(decode, f"Decode: waiting for prefill {request_id}")
    await client.aclose()  # the client hangs up before any byte of the response

    await wait_for_line(prefill, f"Prefill: cancelled {request_id} (client disconnect)", within=15)
    await wait_for_line(decode, f"Decode: cancelled {request_id} (client disconnect)", within=15)
    assert not any(f"done {request_id}" in line for line in prefill.stdout_lines)
    assert not any(f"prefill done {request_id}" in line for line in decode.stdout_lines)
    labels = {
        "model": "disagg",
        "endpoint": "chat_completions",
        "request_type": "stream" if stream else "unary",
    }
    assert await metric(url, "dynamo_frontend_model_cancellation_total", **labels) == 1
    assert await metric(url, "dynamo_frontend_model_cancellation_total") == 1
    # Counted once on each worker too: one request, cancelled once, in three processes.
    for proc, who in ((decode, "Decode"), (prefill, "Prefill")):
        cancelled = await metric(await status_url(proc, who), "dynamo_component_cancellation_total")
        assert cancelled == 1, who
