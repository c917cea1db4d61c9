"""The per-request slots the edge offers the app in ``scope["extensions"]``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypercorn.typing import HTTPScope


def put_offer(scope: HTTPScope, key: str, value: object) -> None:
    """Offer ``value`` to the app of ``scope``'s request under ``key``."""
    extensions = scope.get("extensions")
    if extensions is None:
        extensions = scope["extensions"] = {}
    cast("dict[str, object]", extensions)[key] = value


def offered(scope: Mapping[str, Any], key: str) -> object:
    """What the edge offered under ``key`` for ``scope``'s request (``None`` if nothing)."""
    return (scope.get("extensions") or {}).get(key)
