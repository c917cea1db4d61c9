"""Helpers around the official Triton gRPC client (blocking: tests call it in threads)."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype


def tensor(values: Any, datatype: str = "INT32", name: str = "INPUT0") -> grpcclient.InferInput:
    """An input tensor holding ``values`` as ``datatype``."""
    array = np.asarray(values, dtype=triton_to_np_dtype(datatype))
    infer_input = grpcclient.InferInput(name, list(array.shape), datatype)
    infer_input.set_data_from_numpy(array)
    return infer_input


class StreamResults:
    """What a ``start_stream`` callback received, in order: ``(result, error)`` pairs."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.queue.put((result, error))

    def take(self, count: int, *, within: float = 30.0) -> list[tuple[Any, Any]]:
        """The next ``count`` callbacks (raises ``queue.Empty`` after ``within`` s)."""
        return [self.queue.get(timeout=within) for _ in range(count)]
