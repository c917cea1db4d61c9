"""Reading response streams in tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from dynamo_trio import StreamIncomplete

if TYPE_CHECKING:
    from dynamo_trio.runtime import ResponseStream


async def drain_cut_by_shutdown(stream: ResponseStream) -> list[Any]:
    """The data of ``stream``'s items, which must end in :class:`StreamIncomplete`:
    the worker stopped the work to shut down, and said so after the drain."""
    items: list[Any] = []

    async def read() -> None:
        async for item in stream:
            items.append(item.data())

    with pytest.raises(StreamIncomplete, match="to shut down"):
        await read()
    return items
