"""What a hostile or confused client sends to the gRPC port gets a clear status, and the
server goes on serving everyone: malformed protobuf, wrong shapes and datatypes, huge
declared sizes, compressed messages, methods that do not exist, an HTTP/1.1 client.

None of it is counted as a cancellation, and the frontend logs no traceback.
"""

from __future__ import annotations

import gzip
from typing import Any

import grpc
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dynamo_trio.kserve._messages import message_class
from dynamo_trio.kserve._wire import frame
from tests._memhttp import http_client

from ._client import StreamResults, tensor
from ._h2 import h2_call
from .conftest import CANCELLED, MODEL, GrpcStack, StartGrpcStack, eventually, wait_for_events

pytestmark = pytest.mark.slow

SERVICE = "/inference.GRPCInferenceService"


async def still_serves(stack: GrpcStack) -> None:
    client = grpcclient.InferenceServerClient(stack.grpc)
    try:
        result = await trio.to_thread.run_sync(lambda: client.infer(MODEL, [tensor([4, 2])]))
    finally:
        client.close()
    assert result.as_numpy("OUTPUT0").tolist() == [4, 2]
    async with http_client(stack.stack.url) as http:  # HTTP undisturbed
        assert (await http.get("/health")).status_code == 200
    assert await stack.stack.metric(CANCELLED, endpoint="tensor") == 0
    assert "Traceback" not in stack.log()


def raw_unary(address: str, method: str, body: bytes) -> grpc.RpcError:
    """Call ``method`` with ``body`` as its serialized request; the error it ends with."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method)
        try:
            call(body, timeout=10)
        except grpc.RpcError as error:
            return error
    raise AssertionError(f"{method} succeeded with {body!r}")


@pytest.fixture
async def stack(grpc_stack: StartGrpcStack) -> GrpcStack:
    return await grpc_stack()


async def test_malformed_protobuf_and_unknown_methods(stack: GrpcStack) -> None:
    cases = [
        (f"{SERVICE}/ModelInfer", b"\x0a\xff\xff\xff\x0f", grpc.StatusCode.INVALID_ARGUMENT),
        (f"{SERVICE}/ModelMetadata", b"\x08", grpc.StatusCode.INVALID_ARGUMENT),
        (f"{SERVICE}/RepositoryIndex", b"", grpc.StatusCode.UNIMPLEMENTED),
        ("/no.Such/Method", b"", grpc.StatusCode.UNIMPLEMENTED),
    ]
    for method, body, code in cases:
        error = await trio.to_thread.run_sync(raw_unary, stack.grpc, method, body)
        assert error.code() == code, (method, error)
        assert error.details(), method
    await still_serves(stack)


def infer_error(
    address: str,
    inputs: list[grpcclient.InferInput],
    model: str = MODEL,
    parameters: dict[str, Any] | None = None,
) -> str:
    client = grpcclient.InferenceServerClient(address)
    try:
        client.infer(model, inputs, parameters=parameters)
    except InferenceServerException as error:
        return f"{error.status()} {error.message()}"
    finally:
        client.close()
    raise AssertionError("the infer succeeded")


async def test_wrong_shapes_datatypes_and_names(stack: GrpcStack) -> None:
    short = tensor([1, 2, 3, 4])
    short._input.shape[:] = [5]  # 16 bytes for 5 INT32s
    negative = tensor([1, 2])
    negative._input.shape[:] = [-2, -1]
    fp16 = tensor(np.array([1, 2], dtype=np.float16), "FP16")
    fp16._input.shape[:] = [3]  # 4 bytes for 3 FP16s
    strings = tensor(np.array([b"a", b"bc"], dtype=np.object_), "BYTES")
    strings._input.shape[:] = [3]  # 2 length-prefixed items for 3
    cases: list[tuple[list[grpcclient.InferInput], str, str]] = [
        ([short], "INVALID_ARGUMENT", "16 raw bytes (20 expected)"),
        ([negative], "INVALID_ARGUMENT", "negative dimension"),
        ([fp16], "INVALID_ARGUMENT", "4 raw bytes (6 expected)"),
        ([strings], "INVALID_ARGUMENT", "2 length-prefixed items (3 expected)"),
        ([tensor([1], name="INPUT9")], "INVALID_ARGUMENT", "INPUT9"),
        ([], "INVALID_ARGUMENT", "INPUT0"),
    ]
    for inputs, status, says in cases:
        error = await trio.to_thread.run_sync(infer_error, stack.grpc, inputs)
        assert status in error and says in error, error
    # The worker's refusal of a parameter is the client's INVALID_ARGUMENT too.
    error = await trio.to_thread.run_sync(
        lambda: infer_error(stack.grpc, [tensor([1])], parameters={"repeat": 0})
    )
    assert "INVALID_ARGUMENT" in error and "repeat" in error, error
    error = await trio.to_thread.run_sync(infer_error, stack.grpc, [tensor([1])], "nope")
    assert "NOT_FOUND" in error, error
    await still_serves(stack)


async def test_a_bad_request_on_a_stream_is_answered_and_the_stream_goes_on(
    stack: GrpcStack,
) -> None:
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()
    bad = tensor([1, 2])
    bad._input.shape[:] = [3]

    def run() -> list[tuple[Any, Any]]:
        client.start_stream(callback=results)
        try:
            client.async_stream_infer(MODEL, [bad], request_id="bad")
            client.async_stream_infer("nope", [tensor([1])], request_id="unknown")
            client.async_stream_infer(MODEL, [tensor([8])], request_id="good")
            return results.take(3)
        finally:
            client.stop_stream()

    try:
        received = await trio.to_thread.run_sync(run)
    finally:
        client.close()
    errors = sorted(str(error) for _, error in received if error is not None)
    assert len(errors) == 2
    assert "INVALID_ARGUMENT" in errors[0] and "raw bytes" in errors[0], errors
    assert "NOT_FOUND" in errors[1], errors
    [good] = [result for result, error in received if error is None]
    assert good.get_response().id == "good"
    assert good.as_numpy("OUTPUT0").tolist() == [8]
    await still_serves(stack)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"\x00\xff\xff\xff\xff" + b"x" * 10, "8", "over the limit"),  # RESOURCE_EXHAUSTED
        (b"\x01\x00\x00\x00\x02ab", "12", "compressed"),  # UNIMPLEMENTED
        (b"\x07\x00\x00\x00\x00", "3", "flag"),  # INVALID_ARGUMENT
        (b"\x00\x00\x00\x00\x09abc", "3", "ended inside a message"),
        (b"\x00\x00\x00\x00\x00" * 2, "3", "one message, not more"),
        (b"", "3", "one message, not none"),
    ],
)
async def test_framing_errors_end_the_call_with_a_status(
    stack: GrpcStack, body: bytes, status: str, says: str
) -> None:
    reply = await h2_call(stack.grpc, f"{SERVICE}/ModelInfer", body)
    assert reply.headers[":status"] == "200"
    assert reply.trailers["grpc-status"] == status, reply
    assert says in reply.trailers["grpc-message"], reply
    await still_serves(stack)


async def test_compressed_calls_a_bomb_and_an_encoding_not_accepted(stack: GrpcStack) -> None:
    """A gzip message inflates (and the reply says what a client may send); a megabyte of
    zeros that inflates over the 16 MiB limit (from 16 KiB) is RESOURCE_EXHAUSTED; an
    encoding not accepted is UNIMPLEMENTED, naming it."""
    request = message_class("ModelInferRequest")(model_name=MODEL, id="zipped")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[2]).contents.int_contents.extend(
        [4, 2]
    )
    body = gzip.compress(request.SerializeToString())
    zipped = await h2_call(
        stack.grpc,
        f"{SERVICE}/ModelInfer",
        b"\x01" + len(body).to_bytes(4, "big") + body,
        headers=(("grpc-encoding", "gzip"),),
    )
    assert zipped.trailers["grpc-status"] == "0", zipped
    assert zipped.headers["grpc-accept-encoding"] == "identity, deflate, gzip"
    response = message_class("ModelInferResponse").FromString(zipped.data[5:])
    assert (response.id, list(response.outputs[0].contents.int_contents)) == ("zipped", [4, 2])

    bomb = gzip.compress(bytes(17 << 20))
    assert len(bomb) < 32 * 1024
    for path in ("ModelInfer", "ModelStreamInfer"):
        refused = await h2_call(
            stack.grpc,
            f"{SERVICE}/{path}",
            b"\x01" + len(bomb).to_bytes(4, "big") + bomb,
            headers=(("grpc-encoding", "gzip"),),
        )
        assert refused.trailers["grpc-status"] == "8", refused
        assert "inflates to over the limit" in refused.trailers["grpc-message"]

    unknown = await h2_call(
        stack.grpc, f"{SERVICE}/ModelInfer", frame(b""), headers=(("grpc-encoding", "zstd"),)
    )
    assert unknown.trailers["grpc-status"] == "12", unknown
    assert "'zstd'" in unknown.trailers["grpc-message"]
    assert unknown.headers["grpc-accept-encoding"] == "identity, deflate, gzip"
    await still_serves(stack)


async def test_a_huge_declared_size_on_a_stream_ends_it_without_waiting_for_the_body(
    stack: GrpcStack,
) -> None:
    reply = await h2_call(
        stack.grpc, f"{SERVICE}/ModelStreamInfer", b"\x00\xff\xff\xff\xf0", end_stream=False
    )
    assert reply.trailers["grpc-status"] == "8", reply
    await still_serves(stack)


async def test_an_http11_client_on_the_grpc_port(stack: GrpcStack) -> None:
    async with http_client(f"http://{stack.grpc}") as http:
        response = await http.post(f"{SERVICE}/ModelInfer", content=b"\x00\x00\x00\x00\x00")
        get = await http.get("/")
    assert response.status_code == 505
    assert "gRPC" in response.text
    assert get.status_code == 505
    await still_serves(stack)


async def test_a_stream_holds_a_bounded_number_of_bytes(
    grpc_stack: StartGrpcStack, env: dict[str, str]
) -> None:
    """With 64 KiB messages, a call may have 4 x 64 KiB of requests running: the fifth
    large one is refused, the small one after it is not."""
    env["DYN_HTTP_MAX_BODY_SIZE"] = str(64 * 1024)
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    results = StreamResults()
    large = np.arange(15_000, dtype=np.int32)  # 60,000 bytes

    def run() -> list[tuple[Any, Any]]:
        client.start_stream(callback=results)
        for n in range(5):
            client.async_stream_infer(
                MODEL, [tensor(large)], request_id=f"large{n}", parameters={"delay_ms": 60_000}
            )
        client.async_stream_infer(MODEL, [tensor([3])], request_id="small")
        return results.take(2)

    try:
        received = await trio.to_thread.run_sync(run)
    finally:
        await trio.to_thread.run_sync(lambda: client.stop_stream(cancel_requests=True))
        client.close()
    [refused] = [error for _, error in received if error is not None]
    assert "RESOURCE_EXHAUSTED" in str(refused) and "bytes" in str(refused)
    [small] = [result for result, error in received if error is None]
    assert small.get_response().id == "small"


async def test_unary_calls_hold_a_bounded_number_of_bytes(
    grpc_stack: StartGrpcStack, env: dict[str, str]
) -> None:
    """With 64 KiB messages, the calls of a process may hold 16 x 64 KiB: with 16 calls of
    62,000 bytes held by their worker, a 17th is refused, and so is a stream call's request
    as large; a small one is not (the refused ones hold nothing).  Once the 16 are
    cancelled, all is given back: the same again (one refused request's bytes kept would
    refuse the 16th)."""
    env["DYN_HTTP_MAX_BODY_SIZE"] = str(64 * 1024)
    stack = await grpc_stack()
    client = grpcclient.InferenceServerClient(stack.grpc)
    large = np.arange(15_500, dtype=np.int32)  # 62,000 bytes
    request = message_class("ModelInferRequest")(model_name=MODEL, id="streamed")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[15_500])
    request.raw_input_contents.append(large.tobytes())

    def hold(round_: int) -> list[Any]:
        return [
            client.async_infer(
                MODEL,
                [tensor(large)],
                callback=lambda result, error: None,
                request_id=f"held{round_}-{n}",
                parameters={"delay_ms": 60_000},
            )
            for n in range(16)
        ]

    for round_ in range(2):
        held = await trio.to_thread.run_sync(hold, round_)
        try:
            await wait_for_events(stack.worker, "start", 18 * round_ + 16)
            refused = await trio.to_thread.run_sync(infer_error, stack.grpc, [tensor(large)])
            assert refused.startswith("StatusCode.RESOURCE_EXHAUSTED"), refused
            assert "bytes of requests" in refused, refused
            small = await trio.to_thread.run_sync(lambda: client.infer(MODEL, [tensor([5])]))
            assert small.as_numpy("OUTPUT0").tolist() == [5]
            # A stream's request counts too, from its prefix: its call ends, holding nothing.
            streamed = await h2_call(
                stack.grpc, f"{SERVICE}/ModelStreamInfer", frame(request.SerializeToString())
            )
            assert streamed.trailers["grpc-status"] == "8", streamed
            assert "bytes of requests" in streamed.trailers["grpc-message"], streamed
            small = await trio.to_thread.run_sync(lambda: client.infer(MODEL, [tensor([6])]))
            assert small.as_numpy("OUTPUT0").tolist() == [6]
        finally:
            for future in held:
                future.cancel()
        await wait_for_events(stack.worker, "exit", 18 * (round_ + 1))  # 16 and 2 small
    again = await trio.to_thread.run_sync(lambda: client.infer(MODEL, [tensor(large)]))
    client.close()
    assert again.as_numpy("OUTPUT0").tolist() == large.tolist()
    await eventually(lambda: stack.stack.metric(CANCELLED, endpoint="tensor"), 32)
