"""The public surface is exactly what ``__all__`` says (as httpx pins its own)."""

from __future__ import annotations

import enum
import inspect

import pytest

import dynamo_trio


def test_all_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(dynamo_trio).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert set(dynamo_trio.__all__) == public
    assert len(dynamo_trio.__all__) == len(set(dynamo_trio.__all__))


def test_public_names_come_from_the_package() -> None:
    for name in dynamo_trio.__all__:
        assert getattr(dynamo_trio, name).__module__.startswith("dynamo_trio."), name


def test_the_spec_example_imports_work() -> None:
    from dynamo_trio import Context, DistributedRuntime, dynamo_worker

    assert callable(dynamo_worker())
    assert Context().id() != Context().id()
    assert DistributedRuntime.__module__ == "dynamo_trio.runtime._runtime"


_OPEN_FOR_EXTENSION = {
    "ResponseStream": "DataStream extends it (annotated=False)",
}
"""Public classes that are not ``@final``, and why."""


def _public_classes() -> list[str]:
    return [
        name
        for name in dynamo_trio.__all__
        if inspect.isclass(cls := getattr(dynamo_trio, name))
        and not issubclass(cls, BaseException | enum.Enum)  # errors form a hierarchy
    ]


@pytest.mark.parametrize("name", _public_classes())
def test_public_classes_are_final(name: str) -> None:
    cls = getattr(dynamo_trio, name)
    if name in _OPEN_FOR_EXTENSION:
        assert not getattr(cls, "__final__", False), f"{name} is final: drop it from the list"
    else:
        assert getattr(cls, "__final__", False), f"{name} is public: mark it @final"
