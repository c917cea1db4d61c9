"""Helpers for the llm tests: engine items, SSE bodies, official clients on a mock transport."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx2
import openai

from dynamo_trio.llm import DONE, FinishReason, encode_event


def items(
    texts: Sequence[str],
    finish_reason: FinishReason | None = "stop",
    *,
    prompt_tokens: int = 7,
    stop_sequence: str | None = None,
) -> list[dict[str, Any]]:
    """Engine output items: one per text delta, the last with ``finish_reason`` and usage."""
    out: list[dict[str, Any]] = [
        {"text": text, "token_ids": [index]} for index, text in enumerate(texts)
    ]
    if finish_reason is not None:
        last: dict[str, Any] = {
            "text": "",
            "token_ids": [],
            "finish_reason": finish_reason,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(texts)},
        }
        if stop_sequence is not None:
            last["stop_sequence"] = stop_sequence
        out.append(last)
    return out


def sse(
    events: Iterable[Mapping[str, object]], *, named: bool = False, done: bool = False
) -> bytes:
    """An SSE body: each event encoded (named after its ``type`` if ``named``), then [DONE]."""
    body = b"".join(encode_event(e, event=str(e["type"]) if named else None) for e in events)
    return body + (DONE if done else b"")


Handler = Callable[[httpx2.Request], httpx2.Response]


def stream_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)


def openai_client(handler: Handler, *, strict: bool = True) -> openai.OpenAI:
    """The official client talking to ``handler``, validating responses strictly by default."""
    return openai.OpenAI(
        api_key="test",
        base_url="http://frontend.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        _strict_response_validation=strict,
    )
