"""The official openai client against a real engine behind the frontend."""

from __future__ import annotations

from typing import Any

import openai

MESSAGES: Any = [{"role": "user", "content": "tell me a long story"}]


def chat_then_hang_ups(url: str, hang_ups: int) -> tuple[Any, list[str]]:
    """One unary chat of 5 tokens, then ``hang_ups`` streams each closed after 5 chunks
    (blocking: run it in a thread). Returns the unary answer and each stream's text."""
    texts = []
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        whole = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, extra_body={"ignore_eos": True}
        )
        for _ in range(hang_ups):
            stream = client.chat.completions.create(
                model="tiny",
                messages=MESSAGES,
                max_tokens=1500,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = []
            for chunk in stream:
                chunks.append(chunk.choices[0].delta.content or "")
                if len(chunks) == 5:
                    break
            stream.close()  # hang up
            texts.append("".join(chunks))
    return whole, texts
