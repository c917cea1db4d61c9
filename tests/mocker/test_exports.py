"""The public surface of dynamo_trio.mocker is exactly its __all__."""

from __future__ import annotations

import dynamo_trio.mocker


def test_all_names_the_public_surface() -> None:
    public = {name for name in vars(dynamo_trio.mocker) if not name.startswith("_")}
    assert set(dynamo_trio.mocker.__all__) == public
