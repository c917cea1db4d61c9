"""A generate request's prompt as token ids, and how many tokens it may generate.

Chat messages go through the model's chat template (with the generation
prompt); a model without one (a base model) gets plain ``role: content``
turns.  A completion prompt is encoded with the tokenizer's special tokens.
A text engine registers its model for both kinds of request the same way.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Final

from ..llm import ContextLengthExceeded

if TYPE_CHECKING:
    from ..llm import GenerateRequest
    from ..runtime import Endpoint


def prompt_ids(tokenizer: Any, request: GenerateRequest, context_length: int) -> list[int]:
    """The token ids the engine is given for ``request``.

    Raises:
        ContextLengthExceeded: if the prompt text is too long for ``context_length``
            tokens whatever they are, checked before tokenizing it.
    """
    kind = "prompt" if request["request_type"] == "completion" else "messages"
    if kind == "prompt":
        text = request.get("prompt", "")
        check_length(tokenizer, text, context_length, kind)
        return list(tokenizer(text)["input_ids"])
    messages = [dict(message) for message in request.get("messages", ())]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    check_length(tokenizer, text, context_length, kind)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_LONGEST: Final[weakref.WeakKeyDictionary[Any, int]] = weakref.WeakKeyDictionary()


def check_length(tokenizer: Any, text: str, context_length: int, kind: str) -> None:
    """Refuse ``text`` if it has more characters than ``context_length`` tokens can cover.

    No token covers more of a text than its vocabulary's longest entry has characters
    (vLLM bounds a prompt the same way): a text too long to fit is refused without the
    cost of tokenizing it.
    """
    longest = _LONGEST.get(tokenizer)
    if longest is None:
        longest = _LONGEST[tokenizer] = max(map(len, tokenizer.get_vocab()), default=1)
    most = context_length * longest
    if len(text) > most:
        raise ContextLengthExceeded(
            context_length=context_length,
            prompt_tokens=None,
            max_tokens=None,
            prompt_kind=kind,
            prompt_chars=(len(text), most),
        )


def output_budget(
    request: GenerateRequest, prompt_tokens: int, context_length: int, default: int | None
) -> int:
    """The most tokens ``request`` generates: its ``max_tokens``, else ``default``, within
    what the context leaves (all of it when ``default`` is ``None``).

    Raises:
        ContextLengthExceeded: if the prompt leaves no room, or less than ``max_tokens``.
    """
    requested = request.get("max_tokens")
    room = context_length - prompt_tokens
    if room <= 0 or (requested is not None and requested > room):
        raise ContextLengthExceeded(
            context_length=context_length,
            prompt_tokens=prompt_tokens,
            max_tokens=requested if room > 0 else None,
            prompt_kind="prompt" if request["request_type"] == "completion" else "messages",
        )
    if requested is not None:
        return requested
    return room if default is None else min(default, room)


async def register_text_model(served: Endpoint, model_name: str, context_length: int) -> None:
    """Register ``model_name`` on ``served`` for chat and completions; the engine takes
    continuations (a request moved from a failed worker resumes here)."""
    await served.register_model(
        model_name, "chat", context_length=context_length, accepts_continuation=True
    )
    await served.register_model(
        model_name, "completions", context_length=context_length, accepts_continuation=True
    )
