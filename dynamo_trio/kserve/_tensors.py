"""Tensors between KServe's messages and a worker's requests (Dynamo's tensor shape).

A worker receives and yields dicts with ``id``, ``model``, ``tensors`` (each
``{"metadata": {name, data_type, shape}, "data": {data_type, values}}``, values flat and
row-major), ``parameters`` and ``outputs``.  A raw request (``raw_input_contents``), or
one with ``FP16``/``BF16`` outputs, is answered raw.  A client's mistake is an
``INVALID_ARGUMENT`` here, before any worker is called; docs/kserve.md shows the shapes.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from typing import Any, Final, NamedTuple

from ..discovery import TENSOR_DATA_TYPES
from ._status import GrpcError, Status


class DType(NamedTuple):
    """One tensor datatype: its names, where its values go, how it packs."""

    kserve: str
    dynamo: str
    contents: str | None
    """Its ``InferTensorContents`` field (``None``: the raw form only, as Triton has it)."""
    config: str
    """Its name in ``ModelConfig`` (``inference.DataType``)."""
    code: str
    """The ``array`` typecode of one element (``""``: packed by :data:`_CODECS`)."""
    size: int
    """Bytes per element in the raw form (``0``: ``BYTES``, each item length-prefixed)."""
    bounds: tuple[int, int] | None
    """The range of an integer type narrower than its ``contents`` field."""


def _dtype(kserve: str, contents: str | None, code: str, size: int) -> DType:
    bounds = None
    if code in ("b", "h", "B", "H") and kserve != "BOOL":
        bits = 8 * size
        bounds = (0, 2**bits - 1) if code.isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    config = "TYPE_STRING" if kserve == "BYTES" else f"TYPE_{kserve}"
    return DType(kserve, TENSOR_DATA_TYPES[kserve], contents, config, code, size, bounds)


DTYPES: Final = {
    dtype.kserve: dtype
    for dtype in (
        _dtype(kserve, contents, code, size)
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
            ("FP16", None, "", 2),
            ("BF16", None, "", 2),
            ("FP32", "fp32_contents", "f", 4),
            ("FP64", "fp64_contents", "d", 8),
            ("BYTES", "bytes_contents", "", 0),
        )
    )
}
"""By KServe name (:data:`~dynamo_trio.discovery.TENSOR_DATA_TYPES`)."""

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


def _invalid(message: str) -> GrpcError:
    return GrpcError(Status.INVALID_ARGUMENT, message)


def _elements(name: str, shape: list[int]) -> int:
    if any(dim < 0 for dim in shape):
        raise _invalid(f"input {name!r}: the shape {shape} has a negative dimension")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise _invalid(f"input {name!r}: the shape {shape} declares over {MAX_ELEMENTS} elements")
    return count


# ---------------------------------------------------------------- the raw form, by type


def _unpack_array(dtype: DType, raw: bytes, count: int) -> list[Any]:
    values = array(dtype.code, raw)
    if _SWAP:
        values.byteswap()
    if dtype.kserve == "BOOL":
        return [bool(value) for value in values]
    return values.tolist()


def _pack_array(dtype: DType, values: list[Any]) -> bytes:
    packed = array(dtype.code, [int(bool(v)) for v in values] if dtype.kserve == "BOOL" else values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def _unpack_fp16(dtype: DType, raw: bytes, count: int) -> list[Any]:
    return list(struct.unpack(f"<{count}e", raw))


def _pack_fp16(dtype: DType, values: list[Any]) -> bytes:
    try:
        return struct.pack(f"<{len(values)}e", *values)
    except OverflowError:  # a finite value beyond half precision's range is an infinity
        return b"".join(_half(float(value)) for value in values)
    except struct.error as exc:
        raise TypeError(str(exc)) from None


def _half(value: float) -> bytes:
    try:
        return struct.pack("<e", value)
    except OverflowError:
        return struct.pack("<e", math.copysign(math.inf, value))


def _unpack_bf16(dtype: DType, raw: bytes, count: int) -> list[Any]:
    halves = array("H", raw)
    if _SWAP:
        halves.byteswap()
    return array("f", array("I", [half << 16 for half in halves]).tobytes()).tolist()


def _pack_bf16(dtype: DType, values: list[Any]) -> bytes:
    # bfloat16 is the top half of a float32, rounded to nearest even (a NaN stays one).
    halves = array(
        "H",
        [
            (bits >> 16) | 0x40
            if bits & 0x7FFFFFFF > 0x7F800000
            else (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            for bits in array("I", array("f", values).tobytes())
        ],
    )
    if _SWAP:
        halves.byteswap()
    return halves.tobytes()


def _unpack_bytes(dtype: DType, raw: bytes, count: int) -> list[Any]:
    items: list[Any] = []
    view, offset, end = memoryview(raw), 0, len(raw)
    while offset < end:
        if len(items) == count:
            raise ValueError(f"{end - offset} bytes after the {count} items of the shape")
        if end - offset < 4:
            raise ValueError(f"{end - offset} bytes at offset {offset} for an item's 4-byte length")
        length = int.from_bytes(view[offset : offset + 4], "little")
        offset += 4
        if length > end - offset:
            raise ValueError(
                f"the item at offset {offset - 4} declares {length} bytes; {end - offset} remain"
            )
        items.append(list(view[offset : offset + length]))
        offset += length
    if len(items) != count:
        raise ValueError(f"{len(items)} length-prefixed items ({count} expected)")
    return items


def _pack_bytes(dtype: DType, values: list[Any]) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in map(_item, values))


def _item(value: Any) -> bytes:
    """One ``Bytes`` element a worker gave: a list of byte values."""
    if type(value) is not list:
        raise TypeError(f"a Bytes element is a list of byte values, not a {type(value).__name__}")
    return bytes(value)


_CODECS: Final = {
    "FP16": (_unpack_fp16, _pack_fp16),
    "BF16": (_unpack_bf16, _pack_bf16),
    "BYTES": (_unpack_bytes, _pack_bytes),
}
"""How the types ``array`` cannot pack go to and from the raw form (the rest: ``array``)."""


def _unpack(dtype: DType, raw: bytes, count: int) -> list[Any]:
    """The worker's values of ``count`` elements in ``raw`` (``ValueError``: a wrong size)."""
    if dtype.size and len(raw) != count * dtype.size:
        raise ValueError(f"{len(raw)} raw bytes ({count * dtype.size} expected)")
    unpack, _ = _CODECS.get(dtype.kserve, (_unpack_array, _pack_array))
    return unpack(dtype, raw, count)


def _pack(dtype: DType, values: list[Any]) -> bytes:
    _, pack = _CODECS.get(dtype.kserve, (_unpack_array, _pack_array))
    return pack(dtype, values)


def _in_bounds(dtype: DType, values: list[Any]) -> str | None:
    """Why ``values`` do not fit ``dtype``, or ``None``."""
    if dtype.bounds is None or not values:
        return None
    low, high = dtype.bounds
    if min(values) < low or max(values) > high:
        return f"values outside {dtype.kserve}'s range {low}..{high}"
    return None


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
            try:
                values = _unpack(dtype, raw[index], count)
            except ValueError as exc:
                raise _invalid(
                    f"input {name!r}: {exc} in raw_input_contents for the shape {shape} "
                    f"of {dtype.kserve}"
                ) from None
        elif dtype.contents is None:
            raise _invalid(
                f"input {name!r}: {dtype.kserve} goes in raw_input_contents "
                "(InferTensorContents has no field for it)"
            )
        else:
            values = list(getattr(tensor.contents, dtype.contents))
            if len(values) != count:
                raise _invalid(
                    f"input {name!r}: {len(values)} values in {dtype.contents} for the "
                    f"shape {shape} ({count} expected)"
                )
            if (problem := _in_bounds(dtype, values)) is not None:
                raise _invalid(f"input {name!r}: {problem} in {dtype.contents}")
            if dtype.kserve == "BOOL":
                values = [bool(value) for value in values]
            elif dtype.kserve == "BYTES":
                values = [list(value) for value in values]
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
    tensors = [
        (tensor["metadata"], kserve_dtype(str(tensor["data"]["data_type"])), tensor["data"])
        for tensor in item["tensors"]
    ]
    # The raw form is all outputs' or none's: an FP16 or BF16 output takes them all there.
    raw = raw or any(dtype.contents is None for _, dtype, _ in tensors)
    for metadata, dtype, data in tensors:
        shape = [int(dim) for dim in metadata["shape"]]
        values = list(data["values"])
        if len(values) != math.prod(shape):
            raise ValueError(f"{len(values)} values for the shape {shape}")
        if (problem := _in_bounds(dtype, values)) is not None:
            raise ValueError(problem)
        output = response.outputs.add(name=str(metadata["name"]), datatype=dtype.kserve)
        output.shape.extend(shape)
        if raw:
            response.raw_output_contents.append(_pack(dtype, values))
        elif dtype.kserve == "BYTES":
            output.contents.bytes_contents.extend(map(_item, values))
        else:
            assert dtype.contents is not None
            getattr(output.contents, dtype.contents).extend(values)
    return response
