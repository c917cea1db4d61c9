"""A prompt too long for the context is refused by its characters, before tokenizing."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_trio.engines._prompt import prompt_ids
from dynamo_trio.llm import ContextLengthExceeded


class Words:
    """A tokenizer of space-separated words; its longest entry has 5 characters."""

    chat_template = None

    def __init__(self) -> None:
        self.calls = 0

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "hello": 1, "bc": 2}

    def __call__(self, text: str, **options: Any) -> dict[str, list[int]]:
        self.calls += 1
        return {"input_ids": [len(word) for word in text.split()]}


def test_a_prompt_within_the_bound_is_tokenized() -> None:
    tokenizer = Words()
    request: Any = {"request_type": "completion", "prompt": "hello" * 4}  # 20 characters
    assert prompt_ids(tokenizer, request, 4) == [20]
    assert tokenizer.calls == 1


@pytest.mark.parametrize(("request_type", "kind"), [("completion", "prompt"), ("chat", "messages")])
def test_a_prompt_over_the_bound_is_refused_untokenized(request_type: str, kind: str) -> None:
    tokenizer = Words()
    request: Any = {"request_type": request_type, "prompt": "a" * 21}
    request["messages"] = [{"role": "user", "content": "a" * 21}]
    with pytest.raises(ContextLengthExceeded) as refused:
        prompt_ids(tokenizer, request, 4)
    assert tokenizer.calls == 0
    chars = 21 if kind == "prompt" else len("user: " + "a" * 21 + "\nassistant:")
    assert f"your {kind} contains {chars} characters (more than 20, " in str(refused.value)
    assert refused.value.prompt_tokens is None
