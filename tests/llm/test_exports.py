"""The public surface of dynamo_trio.llm is exactly its __all__."""

from __future__ import annotations

import dynamo_trio.llm


def test_all_names_the_public_surface() -> None:
    public = {name for name in vars(dynamo_trio.llm) if not name.startswith("_")}
    assert set(dynamo_trio.llm.__all__) == public
    assert len(dynamo_trio.llm.__all__) == len(set(dynamo_trio.llm.__all__))
