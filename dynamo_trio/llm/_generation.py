"""Folding a stream of engine output items into one generation: text, finish reason, usage.

Every API builder (unary and streaming, OpenAI, Responses, Anthropic) reads
engine items through a :class:`Generation`, so they agree on the rules: items
are validated, text deltas concatenate, the first ``finish_reason`` ends the
generation (later items are ignored), ``finish_reason: "error"`` raises
:class:`~dynamo_trio.llm.EngineError`, and usage is the last usage the engine
reported, with the number of token ids seen standing in for a missing
``completion_tokens``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._protocol import EngineError, FinishReason, Usage, parse_generate_output

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Generation", "plain_text"]

_PLAIN_KEYS: Final = frozenset({"text", "token_ids"})


def plain_text(item: object) -> str | None:
    """An item's text if it carries only text and token ids, well typed (the common
    item: mid-stream, no finish reason, no usage), else ``None``.

    Such an item is valid as it is, checked at a fraction of the cost of the full
    validation (:func:`~dynamo_trio.llm.parse_generate_output`), which every other
    item still gets.  It is on every streamed token's path, hence the plain loop
    over the token ids rather than ``all()`` over a generator.
    """
    if type(item) is not dict or not item.keys() <= _PLAIN_KEYS:
        return None
    text = item.get("text", "")
    if type(text) is not str:
        return None
    if "token_ids" in item:
        token_ids = item["token_ids"]
        if type(token_ids) is not list:
            return None
        for token_id in token_ids:
            if type(token_id) is not int:
                return None
    return text


class Generation:
    """The state of one generation, built up from its engine output items.

    For a unary response, feed every item and then hand the generation to the
    API's response builder::

        generation = Generation()
        async for item in stream:
            generation.feed(item.data())
        body = chat_completion(request, request_id, generation)

    ``feed`` is synchronous and cheap (a type check of a small dict; the full
    validation only for items with more than text and token ids).
    """

    __slots__ = (
        "_counted_tokens",
        "_finish_reason",
        "_pieces",
        "_reported",
        "_stop_sequence",
        "_untokenized",
    )

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._finish_reason: FinishReason | None = None
        self._stop_sequence: str | None = None
        self._reported: Usage | None = None
        self._counted_tokens = 0
        self._untokenized = 0  # items folded with text and no token ids

    @classmethod
    def collect(cls, items: Iterable[object]) -> Generation:
        """A generation fed with every item of ``items``."""
        generation = cls()
        for item in items:
            generation.feed(item)
        return generation

    def feed(self, item: object) -> str:
        """Fold one engine output item in and return its text delta.

        Returns:
            The item's text, or ``""`` if it has none or arrives after the
            item that ended the generation (such items are ignored).

        Raises:
            EngineError: if the item is malformed or its ``finish_reason`` is
                ``"error"`` (the message is the engine's ``error``).
        """
        if self._finish_reason is not None:
            return ""
        text = plain_text(item)
        if text is not None:
            self.feed_plain(text, item.get("token_ids"))  # type: ignore[attr-defined]
            return text
        output = parse_generate_output(item)
        token_ids = output.get("token_ids")
        if token_ids is not None:
            self._counted_tokens += len(token_ids)
        elif output.get("text"):
            self._untokenized += 1
        usage = output.get("usage")
        if usage is not None:
            self._reported = usage
        reason = output.get("finish_reason")
        if reason == "error":
            raise EngineError(output.get("error") or "the engine failed without saying why")
        text = output.get("text", "")
        if text:
            self._pieces.append(text)
        if reason is not None:
            self._finish_reason = reason
            self._stop_sequence = output.get("stop_sequence")
        return text

    def feed_plain(self, text: str, token_ids: list[int] | None) -> None:
        """Fold in an item already known to carry only text and token ids (the
        caller checked it with :func:`plain_text`): :meth:`feed` without the check."""
        if self._finish_reason is not None:
            return
        if token_ids is not None:
            self._counted_tokens += len(token_ids)
        elif text:
            self._untokenized += 1
        if text:
            self._pieces.append(text)

    @property
    def output_tokens(self) -> int:
        """Output tokens folded in so far, as the frontend's metrics count them: each
        item's token ids, or one for an item with text and no token ids."""
        return self._counted_tokens + self._untokenized

    @property
    def text(self) -> str:
        """The text generated so far."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def finished(self) -> bool:
        """Whether an item with a ``finish_reason`` has been fed."""
        return self._finish_reason is not None

    @property
    def finish_reason(self) -> FinishReason:
        """Why the generation ended: the engine's reason, ``"stop"`` if it gave none."""
        return self._finish_reason or "stop"

    @property
    def stop_sequence(self) -> str | None:
        """The stop sequence that ended the generation, if the engine named one."""
        return self._stop_sequence

    @property
    def usage(self) -> Usage:
        """Token counts: the engine's last report, completed by counting token ids."""
        reported = self._reported
        if reported is None:
            return {"prompt_tokens": 0, "completion_tokens": self._counted_tokens}
        return {
            "prompt_tokens": reported["prompt_tokens"],
            "completion_tokens": reported["completion_tokens"],
        }
