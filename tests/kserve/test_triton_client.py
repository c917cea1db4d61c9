"""The official Triton client against the frontend's KServe gRPC server: readiness,
metadata, unary infers of every datatype, and a stream of infers on one call.

None of these calls is cancelled, so none is counted as a cancellation.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient

from ._client import StreamResults, tensor
from .conftest import CANCELLED, MODEL, REQUESTS, StartGrpcStack

BFLOAT16: Any
try:  # tritonclient from r26.06 on takes BF16 as ml_dtypes.bfloat16 (it requires ml_dtypes)
    from ml_dtypes import bfloat16 as BFLOAT16
except ImportError:  # before, as float32
    BFLOAT16 = np.float32

pytestmark = pytest.mark.slow


async def test_readiness_metadata_and_config(grpc_stack: StartGrpcStack) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    try:
        assert await trio.to_thread.run_sync(client.is_server_live)
        assert await trio.to_thread.run_sync(client.is_server_ready)
        assert await trio.to_thread.run_sync(client.is_model_ready, MODEL)
        assert not await trio.to_thread.run_sync(client.is_model_ready, "no-such-model")
        metadata = await trio.to_thread.run_sync(
            lambda: client.get_model_metadata(MODEL, as_json=True)
        )
        assert metadata["name"] == MODEL
        assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": ["-1"]}]
        assert metadata["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": ["-1"]}]
        config = await trio.to_thread.run_sync(lambda: client.get_model_config(MODEL).config)
        assert config.name == MODEL
        assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
            ("INPUT0", 8, [-1])  # TYPE_INT32
        ]
        assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
            ("OUTPUT0", 8, [-1])
        ]
    finally:
        client.close()


@pytest.mark.parametrize(("datatype", "dtype"), [("INT32", np.int32), ("FP32", np.float32)])
async def test_unary_infer_echoes_the_tensor(
    grpc_stack: StartGrpcStack, datatype: str, dtype: type
) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    values: Any = (np.arange(24).reshape(2, 3, 4) * 1.5 - 7).astype(dtype)
    try:
        result = await trio.to_thread.run_sync(
            lambda: client.infer(MODEL, [tensor(values, datatype)], request_id="req-1")
        )
    finally:
        client.close()
    output = result.as_numpy("OUTPUT0")
    assert output.dtype == dtype
    assert output.shape == (2, 3, 4)
    assert np.array_equal(output, values)
    assert result.get_response().id == "req-1"
    assert result.get_response().model_name == MODEL
    success = await stack.stack.metric(REQUESTS, endpoint="tensor", status="success")
    assert success == 1
    assert await stack.stack.metric(CANCELLED, endpoint="tensor") == 0


EVERY_TYPE: dict[str, Any] = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([0, 7, 255], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([2**64 - 1, 1], dtype=np.uint64),
    "INT8": np.array([-128, 127], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], dtype=np.int16),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "FP16": np.array([[-1.5, 0.0], [65504.0, 0.099975586]], dtype=np.float16),
    "BF16": np.array([-1.5, 0.0, 2.0**100], dtype=BFLOAT16),
    "FP64": np.array([-1.5, 1e300], dtype=np.float64),
    "BYTES": np.array([[b"", "é".encode()], [b"\x00\xff", b"x" * 1000]], dtype=np.object_),
}


async def test_unary_infers_of_every_other_datatype(grpc_stack: StartGrpcStack) -> None:
    """``BYTES`` as numpy objects (length-prefixed on the wire), ``FP16`` and ``BF16`` in
    the raw form: each one comes back as it went, in the same numpy dtype."""
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)

    def echo(datatype: str, values: Any) -> Any:
        infer_input = grpcclient.InferInput("INPUT0", list(values.shape), datatype)
        infer_input.set_data_from_numpy(values)
        return client.infer(MODEL, [infer_input]).as_numpy("OUTPUT0")

    try:
        for datatype, values in EVERY_TYPE.items():
            output = await trio.to_thread.run_sync(echo, datatype, values)
            assert output.dtype == values.dtype, datatype
            assert output.shape == values.shape, datatype
            assert output.tolist() == values.tolist(), datatype
    finally:
        client.close()
    success = await stack.stack.metric(REQUESTS, endpoint="tensor", status="success")
    assert success == len(EVERY_TYPE)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
async def test_compressed_infers_unary_and_streamed(
    grpc_stack: StartGrpcStack, algorithm: str
) -> None:
    """tritonclient's ``compression_algorithm``: grpcio compresses every request message
    and sets ``grpc-encoding``; each is inflated and answered."""
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    values = np.repeat(np.arange(8, dtype=np.int32), 512)  # 16 KiB that compress well
    results = StreamResults()

    def run() -> tuple[Any, list[tuple[Any, Any]]]:
        unary = client.infer(MODEL, [tensor(values)], compression_algorithm=algorithm)
        client.start_stream(callback=results, compression_algorithm=algorithm)
        try:
            for n in range(3):
                client.async_stream_infer(MODEL, [tensor(values + n)], request_id=f"s{n}")
            return unary, results.take(3)
        finally:
            client.stop_stream()

    try:
        unary, streamed = await trio.to_thread.run_sync(run)
    finally:
        client.close()
    assert unary.as_numpy("OUTPUT0").tolist() == values.tolist()
    assert [error for _, error in streamed if error is None] == [None] * 3, streamed
    by_id = {result.get_response().id: result.as_numpy("OUTPUT0") for result, _ in streamed}
    assert {key: value.tolist() for key, value in by_id.items()} == {
        f"s{n}": (values + n).tolist() for n in range(3)
    }


async def test_a_stream_of_100_infers_on_one_call(grpc_stack: StartGrpcStack) -> None:
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()

    def run() -> list[tuple[Any, Any]]:
        client.start_stream(callback=results)
        try:
            for n in range(100):
                client.async_stream_infer(MODEL, [tensor([n, -n, 2 * n])], request_id=f"r{n}")
            # One request may ask for several responses on a stream: three, tagged alike.
            client.async_stream_infer(
                MODEL, [tensor([7])], request_id="thrice", parameters={"repeat": 3}
            )
            return results.take(103)
        finally:
            client.stop_stream()

    try:
        received = await trio.to_thread.run_sync(run)
    finally:
        client.close()
    assert [error for _, error in received if error is not None] == []
    by_id: dict[str, list[list[int]]] = {}
    for result, _ in received:
        response = result.get_response()
        by_id.setdefault(response.id, []).append(result.as_numpy("OUTPUT0").tolist())
    assert by_id.pop("thrice") == [[7], [7], [7]]
    assert by_id == {f"r{n}": [[n, -n, 2 * n]] for n in range(100)}
    assert await stack.stack.metric(REQUESTS, endpoint="tensor", request_type="stream") == 101
    assert await stack.stack.metric(CANCELLED, endpoint="tensor") == 0
    assert await stack.stack.metric("dynamo_component_cancellation_total", worker=True) == 0


async def test_one_connection_serves_calls_for_ever(grpc_stack: StartGrpcStack) -> None:
    """A channel is one connection: more calls on it than hypercorn's default cap (1000)."""
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)

    def run() -> list[int]:
        return [int(client.infer(MODEL, [tensor([n])]).as_numpy("OUTPUT0")[0]) for n in range(1100)]

    try:
        assert await trio.to_thread.run_sync(run) == list(range(1100))
    finally:
        client.close()


CALLS = 320


async def test_many_calls_in_flight_on_one_channel(grpc_stack: StartGrpcStack) -> None:
    """32 calls in flight at a time on one connection, each answered with its own tensor."""
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    slots = threading.Semaphore(32)
    results = StreamResults()

    def answered(result: object, error: object) -> None:
        slots.release()
        results(result, error)

    def run() -> list[tuple[Any, Any]]:
        for n in range(CALLS):
            slots.acquire()
            client.async_infer(MODEL, [tensor([n])], callback=answered, request_id=str(n))
        return results.take(CALLS)

    try:
        received = await trio.to_thread.run_sync(run)
    finally:
        client.close()
    assert [error for _, error in received if error is not None] == []
    assert sorted(int(result.get_response().id) for result, _ in received) == list(range(CALLS))
