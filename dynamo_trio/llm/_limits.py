"""A model's token limits, and the errors for requests over them (docs/llm.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from ._errors import RequestError

if TYPE_CHECKING:
    from .._errors import DynamoError

CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
"""The OpenAI error ``code`` of a request whose prompt and output do not fit the context."""


class TokenLimits(Protocol):
    """What a model can take and give, in tokens (a model card has these fields)."""

    @property
    def context_length(self) -> int | None:
        """Prompt plus output, at most; ``None`` if unknown."""

    @property
    def max_output_tokens(self) -> int | None: ...


def check_output_tokens(
    limits: TokenLimits, requested: dict[str, int | None], *, model: str, anthropic: bool = False
) -> None:
    """Refuse (400 naming it) the first of ``requested`` (``{param: count or None}``) over the
    model's limits, worded as Anthropic's API does if ``anthropic``."""
    known = [n for n in (limits.max_output_tokens, limits.context_length) if n is not None]
    if not known:
        return
    ceiling = min(known)  # the most tokens one request may ask the model to generate
    for param, value in requested.items():
        if value is None or value <= ceiling:
            continue
        if anthropic:
            message = (
                f"{param}: {value} > {ceiling}, which is the maximum allowed number of "
                f"output tokens for {model}"
            )
        else:
            message = (
                f"{param} is too large: {value}. This model supports at most {ceiling} "
                f"completion tokens, whereas you provided {value}."
            )
        raise RequestError(400, message, param=param, code="invalid_value")


class ContextLengthExceeded(ValueError):
    """An engine's refusal: the prompt, plus the tokens asked for, exceed the context window.

    ``max_tokens`` is None if the prompt alone does not fit; ``prompt_kind``
    names the prompt in the message (``"messages"``, ``"prompt"``).  A prompt
    refused before it was tokenized has ``prompt_tokens`` None and
    ``prompt_chars``: its characters, and the most that could fit.
    """

    def __init__(
        self,
        *,
        context_length: int,
        prompt_tokens: int | None,
        max_tokens: int | None,
        prompt_kind: str = "messages",
        prompt_chars: tuple[int, int] | None = None,
    ) -> None:
        start = f"This model's maximum context length is {context_length} tokens. However, "
        if prompt_tokens is None:
            if prompt_chars is None:
                raise TypeError("a prompt refused untokenized is told by its prompt_chars")
            chars, most = prompt_chars
            message = (
                f"{start}your {prompt_kind} contains {chars} characters (more than {most}, "
                f"the most that {context_length} tokens can hold). Please reduce the length "
                f"of the {prompt_kind}."
            )
        elif max_tokens is None:
            message = (
                f"{start}your {prompt_kind} resulted in {prompt_tokens} tokens. Please reduce "
                f"the length of the {prompt_kind}."
            )
        else:
            message = (
                f"{start}you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in "
                f"the {prompt_kind}, {max_tokens} in the completion). Please reduce the length "
                f"of the {prompt_kind} or completion."
            )
        super().__init__(message)
        self.context_length: Final = context_length
        self.prompt_tokens: Final = prompt_tokens
        self.max_tokens: Final = max_tokens


def context_length_error(error: DynamoError, *, param: str | None) -> RequestError | None:
    """The 400 (blaming ``param``) for a worker's :class:`ContextLengthExceeded`, else None."""
    if error.caused_by != ContextLengthExceeded.__name__:
        return None
    return RequestError(400, error.message, param=param, code=CONTEXT_LENGTH_EXCEEDED)
