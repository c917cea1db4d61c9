"""A request body that has already arrived, handed to the app without a wait.

Why
===
hypercorn queues a request's body for the app as ASGI messages (a trio
memory channel per request), and quart-trio reads them in a task of its own,
waking the view once the last one is in.  A memory channel's ``receive``
always yields to the scheduler, even when a message is waiting, so a body
costs the view three scheduler passes after it first asks for it.  A
saturated frontend's pass lasts milliseconds, and a new stream waits about a
dozen of them before its first chunk, so these three are a large share of
its time to first chunk.

What
====
:meth:`BodyPrefetch.offer` (the edge calls it before handing a request to
the app) takes the body messages that are already queued, without waiting.
If the body's ``Content-Length`` bytes are all there but hypercorn has not
queued the body's end yet, it waits for that one message, which comes in
hypercorn's next step (h11 already holds the whole body), under the body
timeout.  It never waits for bytes still on the network.  A complete body
within the size limit is *offered* in ``scope["extensions"]`` under
:data:`PREFETCHED_BODY`; the view takes it with :meth:`BodyPrefetch.take`,
at once.

Nothing downstream sees a difference: the app's ``receive`` replays what was
taken, in order, then reads hypercorn's queue again (an ``http.disconnect``
reaches the hang-up guard as before).  A body that is incomplete, over the
limit, or interrupted by a disconnect is not offered, only replayed, and the
app reads it the usual way (quart-trio applies its own limit and timeout).
Once the view took the body, the replay gives quart-trio an empty body in
its place, so the bytes are not held twice for the request's lifetime.

Only hypercorn's trio queue is read ahead (``receive`` is the bound
``receive`` of a :class:`trio.MemoryReceiveChannel`); any other ``receive``
is passed on untouched.
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final, cast, final

import trio

from ._extensions import offered, put_offer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, HTTPScope

__all__ = ["PREFETCHED_BODY", "BodyPrefetch"]

PREFETCHED_BODY: Final = "dynamo_trio.prefetched_body"
"""The key of a request's :class:`BodyPrefetch` in ``scope["extensions"]``."""


def _is_end(message: ASGIReceiveEvent) -> bool:
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
    """One request's body, taken from hypercorn's queue ahead of the app.

    Made by :meth:`offer`; the app's view takes the body with :meth:`take`.
    """

    __slots__ = ("_body", "_replay", "_taken")

    def __init__(self, replay: list[ASGIReceiveEvent], body: bytes | None) -> None:
        self._replay = replay
        self._body = body
        self._taken = False

    @classmethod
    async def offer(
        cls,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        *,
        limit: int,
        end_timeout: float,
    ) -> ASGIReceiveCallable:
        """Take what is queued of the body of ``scope``'s request; offer it if it is
        complete and at most ``limit`` bytes.  Returns the ``receive`` to give the app.

        Waits only for the body's end once all its declared bytes are queued, and
        at most ``end_timeout`` seconds (then the body is not offered, only replayed).
        """
        channel = getattr(receive, "__self__", None)
        if not isinstance(channel, trio.MemoryReceiveChannel):
            return receive
        taken: list[ASGIReceiveEvent] = []
        size = 0
        while not taken or not _is_end(taken[-1]):
            try:
                message = cast("ASGIReceiveEvent", channel.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            taken.append(message)
            size += len(_body_of(message))
        if taken and not _is_end(taken[-1]) and size == _declared_length(scope):
            # (A queue closed meanwhile is left for the app to find, as it would have.)
            with (
                trio.move_on_after(end_timeout),
                suppress(trio.EndOfChannel, trio.ClosedResourceError),
            ):
                taken.append(await receive())
                size += len(_body_of(taken[-1]))  # (none from hypercorn: h11 had them all)
        if not taken:
            return receive
        complete = taken[-1]["type"] == "http.request" and _is_end(taken[-1])
        body = None
        if complete and size <= limit:
            parts = [part for message in taken if (part := _body_of(message))]
            # One piece (the usual case) is shared with the replay, not copied.
            body = parts[0] if len(parts) == 1 else b"".join(parts)
        prefetch = cls(taken, body)
        if body is not None:
            put_offer(scope, PREFETCHED_BODY, prefetch)
        return prefetch._receive_after(receive)

    @staticmethod
    def take(scope: Mapping[str, Any]) -> bytes | None:
        """The complete body of ``scope``'s request if the edge offered it (once: later
        calls get ``None``); ``None`` means: read it from the app's request."""
        found = offered(scope, PREFETCHED_BODY)
        if not isinstance(found, BodyPrefetch) or found._body is None:
            return None
        body, found._body = found._body, None
        found._taken = True
        return body

    def _receive_after(self, receive: ASGIReceiveCallable) -> ASGIReceiveCallable:
        replay = self._replay

        async def replaying() -> ASGIReceiveEvent:
            if not replay:
                return await receive()
            if self._taken and replay[0]["type"] == "http.request":
                # The view has the body: the app's own copy of it would be dead weight.
                while replay and replay[0]["type"] == "http.request":
                    del replay[0]
                return {"type": "http.request", "body": b"", "more_body": False}
            return replay.pop(0)

        return replaying
