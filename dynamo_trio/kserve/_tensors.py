"""Tensors between KServe's messages and a worker's requests (Dynamo's tensor shape).

A worker serving a ``tensor`` model receives, and yields, JSON-like dicts::

    {"id": "...", "model": "...",
     "tensors": [{"metadata": {"name": "INPUT0", "data_type": "Int32", "shape": [1, 16]},
                  "data": {"data_type": "Int32", "values": [...]}}],
     "parameters": {"delay_ms": 10}, "outputs": ["OUTPUT0"]}

(Dynamo's ``NvCreateTensorRequest``; its response has ``model``, ``id``,
``tensors`` and ``parameters``).  ``values`` are flat, in row-major order,
whether the client sent ``contents`` or ``raw_input_contents`` (the binary
form, little-endian, which is decoded here; a request sent in that form is
answered in it).  Everything a client can get wrong is an
``INVALID_ARGUMENT`` here, before any worker is called: an unknown datatype,
a negative dimension, values whose count is not the shape's, raw bytes whose
length is not the shape's times the item size.
"""

from __future__ import annotations

import math
import sys
from array import array
from typing import Any, Final, NamedTuple

from ..discovery import TENSOR_DATA_TYPES
from ._status import GrpcError, Status

__all__ = [
    "DTYPES",
    "MAX_ELEMENTS",
    "DType",
    "dynamo_dtype",
    "kserve_dtype",
    "response_message",
    "worker_request",
]


class DType(NamedTuple):
    """One tensor datatype: its names, where its values go, how it packs."""

    kserve: str
    dynamo: str
    contents: str
    code: str  # array typecode, little-endian on the wire
    size: int


DTYPES: Final = {
    dtype.kserve: dtype
    for dtype in (
        DType(kserve, TENSOR_DATA_TYPES[kserve], contents, code, size)
        for kserve, contents, code, size in (
            ("BOOL", "bool_contents", "B", 1),
            ("UINT8", "uint_contents", "B", 1),
            ("UINT16", "uint_contents", "H", 2),
            ("UINT32", "uint_contents", "I", 4),
            ("UINT64", "uint64_contents", "Q", 8),
            ("INT8", "int_contents", "b", 1),
            ("INT16", "int_contents", "h", 2),
            ("INT32", "int_contents", "i", 4),
            ("INT64", "int64_contents", "q", 8),
            ("FP32", "fp32_contents", "f", 4),
            ("FP64", "fp64_contents", "d", 8),
        )
    )
}
"""By KServe name (:data:`~dynamo_trio.discovery.TENSOR_DATA_TYPES`: ``BYTES``, ``FP16``
and ``BF16`` are not served)."""

_BY_DYNAMO: Final = {dtype.dynamo: dtype for dtype in DTYPES.values()}

MAX_ELEMENTS: Final = 1 << 28
"""The most elements one tensor may declare (a message's size bounds it sooner)."""

_SWAP: Final = sys.byteorder != "little"


def kserve_dtype(name: str) -> DType:
    """The datatype a worker calls ``name`` (``"Int32"``; KServe's ``"INT32"`` too).

    Raises:
        ValueError: a datatype not served.
    """
    dtype = _BY_DYNAMO.get(name) or DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"unknown tensor datatype {name!r}")
    return dtype


def dynamo_dtype(name: str) -> str:
    """``name`` (either spelling) as a worker spells it (raises ``ValueError``)."""
    return kserve_dtype(name).dynamo


def _invalid(message: str) -> GrpcError:
    return GrpcError(Status.INVALID_ARGUMENT, message)


def _elements(name: str, shape: list[int]) -> int:
    if any(dim < 0 for dim in shape):
        raise _invalid(f"input {name!r}: the shape {shape} has a negative dimension")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise _invalid(f"input {name!r}: the shape {shape} declares over {MAX_ELEMENTS} elements")
    return count


def _unpack(dtype: DType, raw: bytes) -> list[Any]:
    values = array(dtype.code, raw)
    if _SWAP:
        values.byteswap()
    if dtype.kserve == "BOOL":
        return [bool(value) for value in values]
    return values.tolist()


def _pack(dtype: DType, values: list[Any]) -> bytes:
    packed = array(dtype.code, [int(bool(v)) for v in values] if dtype.kserve == "BOOL" else values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def _parameter(value: Any) -> Any:
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def worker_request(message: Any, inputs: set[str] | None) -> tuple[dict[str, Any], bool]:
    """The worker's request for a ``ModelInferRequest``, and whether it came raw.

    ``inputs``: the names the model declares (``None``: any).

    Raises:
        GrpcError: ``INVALID_ARGUMENT``, saying what is wrong.
    """
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise _invalid(
            f"{len(raw)} raw_input_contents for {len(message.inputs)} inputs (one for each)"
        )
    tensors = []
    seen: set[str] = set()
    for index, tensor in enumerate(message.inputs):
        name = tensor.name
        if name in seen:
            raise _invalid(f"input {name!r} is given twice")
        seen.add(name)
        if inputs is not None and name not in inputs:
            raise _invalid(f"the model has no input {name!r} (it has {sorted(inputs)})")
        dtype = DTYPES.get(tensor.datatype)
        if dtype is None:
            raise _invalid(
                f"input {name!r}: datatype {tensor.datatype!r} is not one of {sorted(DTYPES)}"
            )
        shape = list(tensor.shape)
        count = _elements(name, shape)
        if raw:
            packed = raw[index]
            if len(packed) != count * dtype.size:
                raise _invalid(
                    f"input {name!r}: {len(packed)} raw bytes for the shape {shape} of "
                    f"{tensor.datatype} ({count * dtype.size} expected)"
                )
            values = _unpack(dtype, packed)
        else:
            values = list(getattr(tensor.contents, dtype.contents))
            if len(values) != count:
                raise _invalid(
                    f"input {name!r}: {len(values)} values in {dtype.contents} for the "
                    f"shape {shape} ({count} expected)"
                )
            if dtype.kserve == "BOOL":
                values = [bool(value) for value in values]
        metadata = {"name": name, "data_type": dtype.dynamo, "shape": shape}
        tensors.append(
            {"metadata": metadata, "data": {"data_type": dtype.dynamo, "values": values}}
        )
    if inputs is not None and (missing := inputs - seen):
        raise _invalid(f"the request lacks the input(s) {sorted(missing)}")
    request = {
        "id": message.id,
        "model": message.model_name,
        "tensors": tensors,
        "parameters": {key: _parameter(value) for key, value in message.parameters.items()},
        "outputs": [output.name for output in message.outputs],
    }
    return request, bool(raw)


def _set_parameter(target: Any, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def response_message(item: Any, response_class: type[Any], *, raw: bool) -> Any:
    """The ``ModelInferResponse`` for one item a worker yielded.

    Raises:
        GrpcError: ``INTERNAL``: the item is not a tensor response.
    """
    try:
        return _response(item, response_class, raw=raw)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise GrpcError(
            Status.INTERNAL, f"the worker's response is not a tensor response ({exc!r})"
        ) from None


def _response(item: Any, response_class: type[Any], *, raw: bool) -> Any:
    response = response_class(model_name=str(item["model"]), id=str(item.get("id") or ""))
    for key, value in (item.get("parameters") or {}).items():
        _set_parameter(response.parameters[str(key)], value)
    for tensor in item["tensors"]:
        metadata, data = tensor["metadata"], tensor["data"]
        dtype = kserve_dtype(str(data["data_type"]))
        shape = [int(dim) for dim in metadata["shape"]]
        values = list(data["values"])
        if len(values) != math.prod(shape):
            raise ValueError(f"{len(values)} values for the shape {shape}")
        output = response.outputs.add(name=str(metadata["name"]), datatype=dtype.kserve)
        output.shape.extend(shape)
        if raw:
            response.raw_output_contents.append(_pack(dtype, values))
        else:
            getattr(output.contents, dtype.contents).extend(values)
    return response
