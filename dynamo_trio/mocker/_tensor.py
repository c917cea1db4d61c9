"""The mock tensor model: ``OUTPUT0`` is ``INPUT0``, for the KServe gRPC frontend.

``INPUT0`` may be of any datatype served (it registers as ``Int32``) and any shape; the
parameters ``delay_ms`` and ``repeat`` are docs/kserve.md's.  A stop ends the request
without another response; a kill cancels the wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import trio

from ..discovery import TENSOR_DATA_TYPES
from ._engine import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._context import Context

MAX_REPEAT: Final = 100_000
_TYPES: Final = frozenset(TENSOR_DATA_TYPES.values())


def tensor_model_config(name: str) -> dict[str, Any]:
    """The ``tensor_model_config`` the mock tensor model registers with."""
    return {
        "name": name,
        "inputs": [{"name": "INPUT0", "data_type": "Int32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "data_type": "Int32", "shape": [-1]}],
    }


def _parameter(parameters: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = parameters.get(name, default)
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"parameter {name!r} must be an integer from {low} to {high}")
    return value


async def echo_tensor(request: dict[str, Any], context: Context) -> AsyncIterator[dict[str, Any]]:
    """The handler: ``repeat`` responses, each ``delay_ms`` after the one before.

    Raises:
        ValueError: no ``INPUT0``, a datatype not served (or its data's not its
            metadata's), or an invalid parameter (the caller's ``INVALID_ARGUMENT``).
    """
    parameters = request.get("parameters") or {}
    delay_ms = _parameter(parameters, "delay_ms", 0, 0, 3_600_000)
    repeat = _parameter(parameters, "repeat", 1, 1, MAX_REPEAT)
    tensor = next((t for t in request["tensors"] if t["metadata"]["name"] == "INPUT0"), None)
    if tensor is None:
        raise ValueError("the request has no INPUT0")
    data_type = tensor["metadata"]["data_type"]
    if data_type not in _TYPES or tensor["data"]["data_type"] != data_type:
        raise ValueError(f"INPUT0 must be one of {', '.join(sorted(_TYPES))}, not {data_type}")
    output = {
        "metadata": {
            "name": "OUTPUT0",
            "data_type": data_type,
            "shape": tensor["metadata"]["shape"],
        },
        "data": tensor["data"],
    }
    for _ in range(repeat):
        if await wait_until(trio.current_time() + delay_ms / 1000, context, burst=True):
            return
        yield {
            "model": request["model"],
            "id": request["id"],
            "tensors": [output],
            "parameters": {},
        }
