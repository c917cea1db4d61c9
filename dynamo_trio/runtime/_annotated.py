"""The item type of response streams, as in Dynamo: data plus SSE-style annotations."""

from __future__ import annotations

from typing import Any, final


@final
class Annotated:
    """One item of a response stream: JSON-like ``data`` and SSE ``id``/``event``/``comment``.

    Handlers may yield plain values (they become ``data``) or an ``Annotated``.
    """

    __slots__ = ("_data", "comment", "event", "id")

    def __init__(
        self,
        data: Any = None,
        *,
        id: str | None = None,
        event: str | None = None,
        comment: list[str] | None = None,
    ) -> None:
        self._data = data
        self.id = id
        self.event = event
        self.comment = comment

    def data(self) -> Any:
        """The item's value (a method, as in Dynamo's Python bindings)."""
        return self._data

    def comments(self) -> list[str] | None:
        """The comment lines (Dynamo's method name; also the :attr:`comment` attribute)."""
        return self.comment

    def is_error(self) -> bool:
        """Always false: an error ends a stream by raising, as in Dynamo."""
        return False

    def __repr__(self) -> str:
        extras = "".join(
            f", {name}={value!r}"
            for name, value in (("id", self.id), ("event", self.event), ("comment", self.comment))
            if value is not None
        )
        return f"Annotated({self._data!r}{extras})"

    def _fields(self) -> tuple[Any, str | None, str | None, list[str] | None]:
        return self._data, self.id, self.event, self.comment

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if isinstance(other, Annotated) else NotImplemented

    __hash__ = None  # type: ignore[assignment]
