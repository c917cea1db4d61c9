"""A request body that has already arrived, handed to the app without a wait
(``docs/architecture.md``, "The HTTP edge")."""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final, cast, final

import trio

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, HTTPScope

PREFETCHED_BODY: Final = "dynamo_trio.prefetched_body"
"""The key of a request's :class:`BodyPrefetch` in ``scope["extensions"]``."""


def is_end(message: ASGIReceiveEvent) -> bool:
    """Whether ``message`` is the last of a request's body (or not part of it)."""
    return message["type"] != "http.request" or not message.get("more_body", False)


def _body_of(message: ASGIReceiveEvent) -> bytes:
    return cast("bytes", message.get("body", b""))


def _declared_length(scope: HTTPScope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


@final
class BodyPrefetch:
    """One request's body, taken from hypercorn's queue ahead of the app by :meth:`offer`
    (waiting only for the end message once all ``Content-Length`` bytes are in); the app's
    view takes it with :meth:`take`, and the app's ``receive`` replays the rest."""

    __slots__ = ("_body", "_taken")

    def __init__(self, body: bytes | None) -> None:
        self._body = body
        self._taken = False

    @classmethod
    async def offer(
        cls, scope: HTTPScope, receive: ASGIReceiveCallable, *, limit: int, end_timeout: float
    ) -> ASGIReceiveCallable:
        """Take what is queued of the body, offer it if complete and within ``limit``, and
        return the ``receive`` to give the app."""
        channel = getattr(receive, "__self__", None)
        if not isinstance(channel, trio.MemoryReceiveChannel):
            return receive
        taken: list[ASGIReceiveEvent] = []
        size = 0
        while not taken or not is_end(taken[-1]):
            try:
                message = cast("ASGIReceiveEvent", channel.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            taken.append(message)
            size += len(_body_of(message))
        if taken and not is_end(taken[-1]) and size == _declared_length(scope):
            # (A queue closed meanwhile is left for the app to find, as it would have.)
            with (
                trio.move_on_after(end_timeout),
                suppress(trio.EndOfChannel, trio.ClosedResourceError),
            ):
                taken.append(await receive())
                size += len(_body_of(taken[-1]))  # (none from hypercorn: h11 had them all)
        if not taken:
            return receive
        complete = taken[-1]["type"] == "http.request" and is_end(taken[-1])
        body = None
        if complete and size <= limit:
            parts = [part for message in taken if (part := _body_of(message))]
            # One piece (the usual case) is shared with the replay, not copied.
            body = parts[0] if len(parts) == 1 else b"".join(parts)
        prefetch = cls(body)
        if body is not None:
            if scope.get("extensions") is None:
                scope["extensions"] = {}
            cast("dict[str, object]", scope["extensions"])[PREFETCHED_BODY] = prefetch

        async def replaying() -> ASGIReceiveEvent:
            if not taken:
                return await receive()
            if prefetch._taken and taken[0]["type"] == "http.request":
                # The view has the body: the app's own copy of it would be dead weight.
                while taken and taken[0]["type"] == "http.request":
                    del taken[0]
                return {"type": "http.request", "body": b"", "more_body": False}
            return taken.pop(0)

        return replaying

    @staticmethod
    def take(scope: Mapping[str, Any]) -> bytes | None:
        """The body the edge offered, once; ``None``: read it from the app's request."""
        found = (scope.get("extensions") or {}).get(PREFETCHED_BODY)
        if not isinstance(found, BodyPrefetch) or found._body is None:
            return None
        body, found._body = found._body, None
        found._taken = True
        return body
