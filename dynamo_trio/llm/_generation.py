"""Folding engine output items into one generation: text, finish, usage (docs/llm.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Generic, TypeVar

from ._protocol import EngineError, FinishReason, Usage, parse_generate_output

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_PLAIN_KEYS: Final = frozenset({"text", "token_ids"})
_NO_IDS: Final[list[object]] = []
_Request = TypeVar("_Request")


def plain_text(item: object) -> str | None:
    """An item's text if it is only well-typed text and token ids (the fast path), else None."""
    if type(item) is not dict or not item.keys() <= _PLAIN_KEYS:
        return None
    text, token_ids = item.get("text", ""), item.get("token_ids", _NO_IDS)
    if type(text) is not str or type(token_ids) is not list:
        return None
    for token_id in token_ids:
        if type(token_id) is not int:
            return None
    return text


class Generation:
    """The state of one generation, built up (synchronously, cheaply) from its engine items."""

    __slots__ = ("_counted", "_pieces", "_reason", "_reported", "_untokenized", "stop_sequence")

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._reason: FinishReason | None = None
        self.stop_sequence: str | None = None
        """The stop sequence that ended generation, if the engine named one."""
        self._reported: Usage | None = None
        self._counted = 0
        self._untokenized = 0  # items folded with text and no token ids

    @classmethod
    def collect(cls, items: Iterable[object]) -> Generation:
        """A generation fed with every item of ``items``."""
        generation = cls()
        for item in items:
            generation.feed(item)
        return generation

    def feed(self, item: object) -> str:
        """Fold one engine output item in and return its text (``""`` after the end); EngineError
        for a malformed item or ``finish_reason: "error"``."""
        if self._reason is not None:
            return ""
        text = plain_text(item)
        if text is not None:
            self.feed_plain(text, item.get("token_ids"))  # type: ignore[attr-defined]
            return text
        output = parse_generate_output(item)
        token_ids = output.get("token_ids")
        if token_ids is not None:
            self._counted += len(token_ids)
        elif output.get("text"):
            self._untokenized += 1
        if (usage := output.get("usage")) is not None:
            self._reported = usage
        if (reason := output.get("finish_reason")) == "error":
            raise EngineError(output.get("error") or "the engine failed without saying why")
        text = output.get("text", "")
        if text:
            self._pieces.append(text)
        if reason is not None:
            self._reason, self.stop_sequence = reason, output.get("stop_sequence")
        return text

    def feed_plain(self, text: str, token_ids: list[int] | None) -> None:
        """:meth:`feed` for an item :func:`plain_text` already accepted."""
        if self._reason is not None:
            return
        if token_ids is not None:
            self._counted += len(token_ids)
        elif text:
            self._untokenized += 1
        if text:
            self._pieces.append(text)

    @property
    def output_tokens(self) -> int:
        """Output tokens so far: token ids, or one per item with text and no token ids."""
        return self._counted + self._untokenized

    @property
    def text(self) -> str:
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def finished(self) -> bool:
        return self._reason is not None

    @property
    def finish_reason(self) -> FinishReason:
        """The engine's reason, ``"stop"`` if it gave none."""
        return self._reason or "stop"

    @property
    def usage(self) -> Usage:
        """The engine's last report (a copy), else the token ids counted."""
        if self._reported is None:
            return {"prompt_tokens": 0, "completion_tokens": self._counted}
        return self._reported.copy()


class EventStream(Generic[_Request]):
    """Engine items in, one API's stream events out for a request: opened once, closed once.
    Subclasses say what opens the stream, what a text delta is, and what closes it
    (``_closing`` gets the last item's text, ``""`` when :meth:`finish` ends it)."""

    __slots__ = ("_closed", "_request", "_request_id", "_started", "generation")

    _delta: Callable[[str], list[dict[str, object]]]
    _closing: Callable[[str], list[dict[str, object]]]

    def __init__(self, request: _Request, request_id: str) -> None:
        self._request, self._request_id = request, request_id
        self.generation = Generation()
        """The generation folded so far (text, finish reason, usage)."""
        self._started = False
        self._closed = False

    def start(self) -> list[dict[str, object]]:
        """The events that open the stream (once; later calls return ``[]``)."""
        if self._started:
            return []
        self._started = True
        return self._opening()

    def feed(self, item: object) -> list[dict[str, object]]:
        """The events for one engine output item, opening the stream first if needed
        (EngineError for a malformed or failed item: answer it with ``fail``)."""
        events = self.start()
        if self._closed:
            return events
        text = self.generation.feed(item)
        if self.generation.finished and self._close():
            return events + self._closing(text)
        return events + self._delta(text) if text else events

    def finish(self) -> list[dict[str, object]]:
        """The events that end the stream once the engine stream is over."""
        events = self.start()
        return events + self._closing("") if self._close() else events

    def _close(self) -> bool:
        """Close the stream: true the first time."""
        closing, self._closed = not self._closed, True
        return closing

    def _opening(self) -> list[dict[str, object]]:
        return []
