"""Tensors between KServe messages and a worker's requests: every datatype served, in
``contents`` and in the raw binary form, and the refusals of what does not add up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dynamo_trio.kserve._messages import DATA_TYPES, message_class
from dynamo_trio.kserve._status import GrpcError, Status
from dynamo_trio.kserve._tensors import DTYPES, response_message, worker_request

Request = message_class("ModelInferRequest")
Response = message_class("ModelInferResponse")

SAMPLES: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True, False, False],
    "UINT8": [0, 1, 2, 3, 254, 255],
    "UINT16": [0, 1, 2, 3, 65534, 65535],
    "UINT32": [0, 1, 2, 3, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2, 3, 2**64 - 2, 2**64 - 1],
    "INT8": [-128, -1, 0, 1, 2, 127],
    "INT16": [-(2**15), -1, 0, 1, 2, 2**15 - 1],
    "INT32": [-(2**31), -1, 0, 1, 2, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 1, 2, 2**63 - 1],
    "FP16": [-1.5, 0.0, 0.25, 1.0, 2.5, 65504.0],
    "BF16": [-1.5, 0.0, 0.25, 1.0, 2.5, 2.0**100],
    "FP32": [-1.5, 0.0, 0.25, 1.0, 2.5, 1024.0],
    "FP64": [-1.5, 0.0, 0.1, 1.0, 2.5, 1e300],
    "BYTES": [b"", b"a", b"\x00\xff", "é".encode(), b"x" * 300, b"six"],
}

NUMPY: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
"""The little-endian numpy dtypes the raw form is checked against (BF16, BYTES: by hand)."""


def packed(datatype: str, values: list[Any]) -> bytes:
    """``values`` in the raw form, as a client packs them (numpy, not the code under test)."""
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)
    if datatype == "BF16":  # the top half of each float32 (the samples are exact in bf16)
        bits = np.asarray(values, dtype="<f4").view("<u4") >> 16
        return bits.astype("<u2").tobytes()
    return np.asarray(values, dtype=NUMPY[datatype]).tobytes()


def unpacked(datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        items, offset = [], 0
        while offset < len(raw):
            length = int.from_bytes(raw[offset : offset + 4], "little")
            items.append(raw[offset + 4 : offset + 4 + length])
            offset += 4 + length
        return items
    if datatype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype("<u4") << 16
        return bits.view("<f4").tolist()  # type: ignore[no-any-return]
    return np.frombuffer(raw, dtype=NUMPY[datatype]).tolist()  # type: ignore[no-any-return]


def worker_values(datatype: str, values: list[Any]) -> list[Any]:
    """What a worker receives: Dynamo's shape (a list of byte values per BYTES item)."""
    return [list(v) for v in values] if datatype == "BYTES" else values


def test_every_type_is_sampled() -> None:
    assert set(SAMPLES) == set(DTYPES)
    assert set(NUMPY) == set(DTYPES) - {"BF16", "BYTES"}
    for name, dtype in DTYPES.items():
        assert dtype.config in DATA_TYPES  # ModelConfig's enum (BYTES: TYPE_STRING)
        assert dtype.size == (0 if name == "BYTES" else np.dtype(NUMPY.get(name, "<u2")).itemsize)


def request(datatype: str, values: list[Any], *, raw: bool) -> Any:
    message = Request(model_name="m", id="r1")
    message.parameters["delay_ms"].int64_param = 3
    message.parameters["note"].string_param = "x"
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3])
    if raw:
        message.raw_input_contents.append(packed(datatype, values))
    else:
        contents = DTYPES[datatype].contents
        assert contents is not None
        getattr(tensor.contents, contents).extend(values)
    message.outputs.add(name="OUTPUT0")
    return message


RAW_ONLY = {"FP16", "BF16"}
"""No ``contents`` field holds them (test_half_precision_is_raw_only)."""


@pytest.mark.parametrize(
    ("datatype", "raw"),
    [
        (name, raw)
        for name in sorted(SAMPLES)
        for raw in (False, True)
        if raw or name not in RAW_ONLY
    ],
)
def test_a_round_trip_through_a_worker(datatype: str, raw: bool) -> None:
    values = SAMPLES[datatype]
    worker_input, came_raw = worker_request(request(datatype, values, raw=raw), {"INPUT0"})
    assert came_raw is raw
    name = DTYPES[datatype].dynamo
    assert worker_input == {
        "id": "r1",
        "model": "m",
        "tensors": [
            {
                "metadata": {"name": "INPUT0", "data_type": name, "shape": [2, 3]},
                "data": {"data_type": name, "values": worker_values(datatype, values)},
            }
        ],
        "parameters": {"delay_ms": 3, "note": "x"},
        "outputs": ["OUTPUT0"],
    }
    item = {
        "model": "m",
        "id": "r1",
        "tensors": worker_input["tensors"],
        "parameters": {"n": 1, "f": 0.5, "b": True},
    }
    response = response_message(item, Response, raw=raw)
    [output] = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("INPUT0", datatype, [2, 3])
    if raw:
        assert response.raw_output_contents[0] == packed(datatype, values)
        assert unpacked(datatype, response.raw_output_contents[0]) == values
    else:
        contents = DTYPES[datatype].contents
        assert contents is not None
        assert list(getattr(output.contents, contents)) == values
    assert response.parameters["b"].bool_param is True
    assert response.parameters["n"].int64_param == 1


def test_half_precision_is_raw_only() -> None:
    """No ``InferTensorContents`` field holds FP16 or BF16: a request must send them raw,
    and a response with such an output is sent raw, all its outputs with it."""
    for datatype in sorted(RAW_ONLY):
        message = Request(model_name="m")
        message.inputs.add(name="INPUT0", datatype=datatype, shape=[1])
        assert "raw_input_contents" in refused(message)
    item = {
        "model": "m",
        "tensors": [
            {
                "metadata": {"name": "A", "shape": [2]},
                "data": {"data_type": "Int32", "values": [1, 2]},
            },
            {
                "metadata": {"name": "B", "shape": [2]},
                "data": {"data_type": "Float16", "values": [0.5, 70000.0]},
            },
        ],
    }
    response = response_message(item, Response, raw=False)
    assert [output.datatype for output in response.outputs] == ["INT32", "FP16"]
    assert not response.outputs[0].contents.int_contents
    assert unpacked("INT32", response.raw_output_contents[0]) == [1, 2]
    # Beyond half precision's range is an infinity, as a float32 to float16 cast makes it.
    assert unpacked("FP16", response.raw_output_contents[1]) == [0.5, float("inf")]


def test_bfloat16_rounds_to_nearest_even() -> None:
    item = {
        "model": "m",
        "tensors": [
            {
                "metadata": {"name": "B", "shape": [4]},
                "data": {
                    "data_type": "BFloat16",
                    "values": [1 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, 1e39],
                },
            }
        ],
    }
    response = response_message(item, Response, raw=True)
    assert unpacked("BF16", response.raw_output_contents[0]) == [
        1.0,
        1.0,  # a tie: to the even one
        1 + 2**-6,  # a tie: to the even one
        float("inf"),
    ]


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_a_raw_input_of_the_wrong_size_is_refused(datatype: str) -> None:
    message = request(datatype, SAMPLES[datatype], raw=True)
    raw = message.raw_input_contents[0]
    for wrong in (raw[:-1], raw + b"\x00", b""):
        message.raw_input_contents[0] = wrong
        text = refused(message)
        assert text.startswith("input 'INPUT0': ") and datatype in text, text
        assert "raw_input_contents" in text and "[2, 3]" in text, text


def test_a_raw_bytes_tensor_that_does_not_add_up() -> None:
    message = request("BYTES", SAMPLES["BYTES"], raw=True)
    message.raw_input_contents[0] = b"\x05\x00\x00\x00abc"
    assert "declares 5 bytes; 3 remain" in refused(message)
    message.raw_input_contents[0] = b"\x00\x00\x00\x00" * 7
    assert "4 bytes after the 6 items" in refused(message)
    message.raw_input_contents[0] = b"\x00\x00\x00\x00" * 5
    assert "5 length-prefixed items (6 expected)" in refused(message)


@pytest.mark.parametrize(
    ("datatype", "values"),
    [("INT8", [128]), ("INT8", [-129]), ("INT16", [2**15]), ("UINT8", [256]), ("UINT16", [2**16])],
)
def test_contents_beyond_a_narrow_type_are_refused(datatype: str, values: list[int]) -> None:
    message = Request(model_name="m")
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=[1])
    contents = DTYPES[datatype].contents
    assert contents is not None
    getattr(tensor.contents, contents).extend(values)
    assert f"outside {datatype}'s range" in refused(message)


def refused(message: Any, inputs: set[str] | None = None) -> str:
    with pytest.raises(GrpcError) as raised:
        worker_request(message, inputs)
    assert raised.value.status is Status.INVALID_ARGUMENT
    return raised.value.message


def test_what_does_not_add_up_is_refused() -> None:
    message = request("INT32", [1, 2, 3, 4, 5, 6], raw=False)
    message.inputs[0].shape[:] = [2, 2]
    assert "4 expected" in refused(message)
    message = request("INT32", [1, 2, 3, 4, 5, 6], raw=True)
    message.inputs[0].shape[:] = [7]
    assert "24 raw bytes (28 expected)" in refused(message)
    message.inputs[0].shape[:] = [2**20, 2**20]
    assert "elements" in refused(message)
    message.raw_input_contents.append(b"")
    assert "one for each" in refused(message)
    message = request("INT32", [1, 2, 3, 4, 5, 6], raw=False)
    message.inputs[0].datatype = "STRING"
    assert "'STRING' is not one of" in refused(message)
    message = request("INT32", [1, 2, 3, 4, 5, 6], raw=False)
    assert "INPUT1" in refused(message, {"INPUT0", "INPUT1"})
    assert "no input" in refused(message, {"X"})
    message.inputs.add(name="INPUT0", datatype="INT32")
    assert "twice" in refused(message)


@pytest.mark.parametrize(
    "item",
    [
        None,
        {"model": "m"},
        {"model": "m", "tensors": [{"metadata": {"name": "O", "shape": [2]}, "data": {}}]},
        {
            "model": "m",
            "tensors": [
                {
                    "metadata": {"name": "O", "shape": [3]},
                    "data": {"data_type": "Int32", "values": [1, 2]},
                }
            ],
        },
        {
            "model": "m",
            "tensors": [
                {
                    "metadata": {"name": "O", "shape": [1]},
                    "data": {"data_type": "Uint8", "values": [256]},
                }
            ],
        },
        *(
            {
                "model": "m",
                "tensors": [
                    {
                        "metadata": {"name": "O", "shape": [1]},
                        "data": {"data_type": data_type, "values": [value]},
                    }
                ],
            }
            for data_type, value in (
                ("Int8", 128),
                ("Uint16", -1),
                ("Bytes", 5),  # not bytes(5): five zero bytes
                ("Bytes", "text"),
                ("Bytes", [256]),
                ("Float16", "x"),
                ("BFloat16", None),
            )
        ),
    ],
)
@pytest.mark.parametrize("raw", [False, True])
def test_a_worker_response_that_is_not_a_tensor_response(item: Any, raw: bool) -> None:
    with pytest.raises(GrpcError) as raised:
        response_message(item, Response, raw=raw)
    assert raised.value.status is Status.INTERNAL
