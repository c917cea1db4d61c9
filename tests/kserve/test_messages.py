"""The messages described in :mod:`dynamo_trio.kserve._messages` are the protocol's: every
field has the name, number, type and cardinality of the Triton client's own descriptors
(generated from KServe's ``grpc_service.proto``), so each side reads the other's bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from tritonclient.grpc import model_config_pb2, service_pb2

from dynamo_trio.kserve._messages import DATA_TYPES, MESSAGES, message_class
from dynamo_trio.kserve._tensors import DTYPES

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor


def theirs(name: str) -> Descriptor:
    outer, *inner = name.split(".")
    for module in (service_pb2, model_config_pb2):
        if outer in module.DESCRIPTOR.message_types_by_name:
            descriptor: Descriptor = module.DESCRIPTOR.message_types_by_name[outer]
            for part in inner:
                descriptor = descriptor.nested_types_by_name[part]
            return descriptor
    raise AssertionError(f"no message {name}")


def shape(field: FieldDescriptor) -> tuple[object, ...]:
    kind = field.message_type or field.enum_type
    return (
        field.name,
        field.type,
        field.is_repeated,
        None if kind is None else kind.full_name.rsplit(".", 1)[-1],
        None if field.containing_oneof is None else field.containing_oneof.name,
    )


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_each_field_is_the_protocols(name: str) -> None:
    ours = message_class(name).DESCRIPTOR
    reference = theirs(name)
    assert ours.full_name == reference.full_name
    for field in ours.fields:
        assert shape(field) == shape(reference.fields_by_number[field.number]), field.name


def test_the_whole_of_the_inference_messages_is_described() -> None:
    for name in ("ModelInferRequest", "ModelInferResponse", "InferParameter"):
        assert set(message_class(name).DESCRIPTOR.fields_by_number) == set(
            theirs(name).fields_by_number
        )


def test_bytes_made_by_either_side_read_the_same_on_the_other() -> None:
    request = service_pb2.ModelInferRequest(model_name="m", id="r")
    request.parameters["delay_ms"].int64_param = 5
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 2])
    tensor.contents.int_contents.extend([3, 4])
    request.raw_input_contents.append(b"\x01\x00\x00\x00")
    ours = message_class("ModelInferRequest").FromString(request.SerializeToString())
    assert ours.SerializeToString(deterministic=True) == request.SerializeToString(
        deterministic=True
    )


def test_every_tensor_datatype_served_has_its_model_config_type() -> None:
    reference = model_config_pb2.DataType
    assert [reference.Name(number) for number in range(len(DATA_TYPES))] == list(DATA_TYPES)
    for name, dtype in DTYPES.items():
        assert dtype.config == ("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}")
        assert dtype.config in DATA_TYPES
