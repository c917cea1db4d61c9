"""Tensors between KServe messages and a worker's requests: every datatype served, in
``contents`` and in the raw binary form, and the refusals of what does not add up."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from dynamo_trio.kserve._messages import message_class
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
    "FP32": [-1.5, 0.0, 0.25, 1.0, 2.5, 1024.0],
    "FP64": [-1.5, 0.0, 0.1, 1.0, 2.5, 1e300],
}


def test_every_sample_and_item_size() -> None:
    assert set(SAMPLES) == set(DTYPES)
    for dtype in DTYPES.values():
        assert array(dtype.code).itemsize == dtype.size


def request(datatype: str, values: list[Any], *, raw: bool) -> Any:
    message = Request(model_name="m", id="r1")
    message.parameters["delay_ms"].int64_param = 3
    message.parameters["note"].string_param = "x"
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3])
    dtype = DTYPES[datatype]
    if raw:
        packed = array(dtype.code, [int(v) for v in values] if datatype == "BOOL" else values)
        message.raw_input_contents.append(packed.tobytes())
    else:
        getattr(tensor.contents, dtype.contents).extend(values)
    message.outputs.add(name="OUTPUT0")
    return message


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
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
                "data": {"data_type": name, "values": values},
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
        dtype = DTYPES[datatype]
        assert list(array(dtype.code, response.raw_output_contents[0])) == [
            int(v) if datatype == "BOOL" else v for v in values
        ]
    else:
        assert list(getattr(output.contents, DTYPES[datatype].contents)) == values
    assert response.parameters["b"].bool_param is True
    assert response.parameters["n"].int64_param == 1


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
    assert "28 expected" in refused(message)
    message.inputs[0].shape[:] = [2**20, 2**20]
    assert "elements" in refused(message)
    message.raw_input_contents.append(b"")
    assert "one for each" in refused(message)
    message = request("INT32", [1, 2, 3, 4, 5, 6], raw=False)
    message.inputs[0].datatype = "BYTES"
    assert "BYTES" in refused(message)
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
    ],
)
def test_a_worker_response_that_is_not_a_tensor_response(item: Any) -> None:
    with pytest.raises(GrpcError) as raised:
        response_message(item, Response, raw=True)
    assert raised.value.status is Status.INTERNAL
