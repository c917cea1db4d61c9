"""The messages of KServe's ``inference.GRPCInferenceService`` (Triton's ``grpc_service.proto``
and the part of ``model_config.proto`` ``ModelConfig`` needs), as a table of fields.

A ``FileDescriptorProto`` is built from the table at import, in a descriptor pool of its
own, so a Triton client's generated classes in the same process do not clash.  Names and
numbers are the protocol's; only the fields this server reads or writes are described.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

if TYPE_CHECKING:
    from google.protobuf.message import Message

PACKAGE: Final = "inference"
SERVICE: Final = f"{PACKAGE}.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS: Final = {
    "bool": _F.TYPE_BOOL,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}

Field = tuple[int, str, str, bool]
"""``(number, name, type, repeated)``; a type not in the scalars is a message or
enum name (``.inference.X``), ``map<string,X>`` a map."""

_PARAMETERS: Final[Field] = (4, "parameters", "map<string,InferParameter>", False)
_NAME_VERSION: Final[list[Field]] = [(1, "name", "string", False), (2, "version", "string", False)]
_TENSOR: Final[list[Field]] = [
    (1, "name", "string", False),
    (2, "datatype", "string", False),
    (3, "shape", "int64", True),
    _PARAMETERS,
    (5, "contents", "InferTensorContents", False),
]
"""An input or output tensor of an infer call; its first three fields are a tensor's metadata."""
_INFER: Final[list[Field]] = [
    (1, "model_name", "string", False),
    (2, "model_version", "string", False),
    (3, "id", "string", False),
    _PARAMETERS,
]

MESSAGES: Final[dict[str, list[Field]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [(1, "live", "bool", False)],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [(1, "ready", "bool", False)],
    "ModelReadyRequest": _NAME_VERSION,
    "ModelReadyResponse": [(1, "ready", "bool", False)],
    "ModelMetadataRequest": _NAME_VERSION,
    "ModelMetadataResponse.TensorMetadata": _TENSOR[:3],
    "ModelMetadataResponse": [
        (1, "name", "string", False),
        (2, "versions", "string", True),
        (3, "platform", "string", False),
        (4, "inputs", "ModelMetadataResponse.TensorMetadata", True),
        (5, "outputs", "ModelMetadataResponse.TensorMetadata", True),
    ],
    "InferParameter": [  # a oneof, parameter_choice
        (1, "bool_param", "bool", False),
        (2, "int64_param", "int64", False),
        (3, "string_param", "string", False),
        (4, "double_param", "double", False),
        (5, "uint64_param", "uint64", False),
    ],
    "InferTensorContents": [
        (1, "bool_contents", "bool", True),
        (2, "int_contents", "int32", True),
        (3, "int64_contents", "int64", True),
        (4, "uint_contents", "uint32", True),
        (5, "uint64_contents", "uint64", True),
        (6, "fp32_contents", "float", True),
        (7, "fp64_contents", "double", True),
        (8, "bytes_contents", "bytes", True),
    ],
    "ModelInferRequest.InferInputTensor": _TENSOR,
    "ModelInferRequest.InferRequestedOutputTensor": [
        (1, "name", "string", False),
        (2, "parameters", "map<string,InferParameter>", False),
    ],
    "ModelInferRequest": [
        *_INFER,
        (5, "inputs", "ModelInferRequest.InferInputTensor", True),
        (6, "outputs", "ModelInferRequest.InferRequestedOutputTensor", True),
        (7, "raw_input_contents", "bytes", True),
    ],
    "ModelInferResponse.InferOutputTensor": _TENSOR,
    "ModelInferResponse": [
        *_INFER,
        (5, "outputs", "ModelInferResponse.InferOutputTensor", True),
        (6, "raw_output_contents", "bytes", True),
    ],
    "ModelStreamInferResponse": [
        (1, "error_message", "string", False),
        (2, "infer_response", "ModelInferResponse", False),
    ],
    "ModelConfigRequest": _NAME_VERSION,
    "ModelInput": [
        (1, "name", "string", False),
        (2, "data_type", "enum DataType", False),
        (4, "dims", "int64", True),
    ],
    "ModelOutput": [
        (1, "name", "string", False),
        (2, "data_type", "enum DataType", False),
        (3, "dims", "int64", True),
    ],
    "ModelConfig": [
        (1, "name", "string", False),
        (2, "platform", "string", False),
        (4, "max_batch_size", "int32", False),
        (5, "input", "ModelInput", True),
        (6, "output", "ModelOutput", True),
        (17, "backend", "string", False),
    ],
    "ModelConfigResponse": [(1, "config", "ModelConfig", False)],
}

DATA_TYPES: Final = (
    "TYPE_INVALID",
    "TYPE_BOOL",
    "TYPE_UINT8",
    "TYPE_UINT16",
    "TYPE_UINT32",
    "TYPE_UINT64",
    "TYPE_INT8",
    "TYPE_INT16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_FP16",
    "TYPE_FP32",
    "TYPE_FP64",
    "TYPE_STRING",
    "TYPE_BF16",
)
"""``inference.DataType`` (``ModelConfig``'s tensor types), in number order."""

_ONEOFS: Final = {"InferParameter": "parameter_choice"}


def _add_field(
    message: descriptor_pb2.DescriptorProto, owner: str, field: Field
) -> descriptor_pb2.DescriptorProto | None:
    """Add ``field`` to ``message``; a map field also needs an entry type, returned."""
    number, name, kind, repeated = field
    proto = message.field.add(number=number, name=name, json_name=_json_name(name))
    proto.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if kind in _SCALARS:
        proto.type = _SCALARS[kind]
        return None
    if kind.startswith("enum "):
        proto.type = _F.TYPE_ENUM
        proto.type_name = f".{PACKAGE}.{kind.removeprefix('enum ')}"
        return None
    if kind.startswith("map<"):
        value = kind.removeprefix("map<string,").removesuffix(">")
        entry_name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
        proto.label = _F.LABEL_REPEATED
        proto.type = _F.TYPE_MESSAGE
        proto.type_name = f".{PACKAGE}.{owner}.{entry_name}"
        entry = descriptor_pb2.DescriptorProto(name=entry_name)
        entry.options.map_entry = True
        _add_field(entry, f"{owner}.{entry_name}", (1, "key", "string", False))
        _add_field(entry, f"{owner}.{entry_name}", (2, "value", value, False))
        return entry
    proto.type = _F.TYPE_MESSAGE
    proto.type_name = f".{PACKAGE}.{kind}"
    return None


def _json_name(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="dynamo_trio/kserve/inference.proto", package=PACKAGE, syntax="proto3"
    )
    enum = file.enum_type.add(name="DataType")
    for number, value in enumerate(DATA_TYPES):
        enum.value.add(name=value, number=number)
    protos: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name in sorted(MESSAGES, key=lambda name: name.count(".")):  # outer ones first
        fields = MESSAGES[full_name]
        outer, _, inner = full_name.rpartition(".")
        if outer:
            proto = protos[outer].nested_type.add(name=inner)
        else:
            proto = file.message_type.add(name=full_name)
        protos[full_name] = proto
        oneof = _ONEOFS.get(full_name)
        if oneof is not None:
            proto.oneof_decl.add(name=oneof)
        for field in fields:
            entry = _add_field(proto, full_name, field)
            if entry is not None:
                proto.nested_type.append(entry)
            if oneof is not None:
                proto.field[-1].oneof_index = 0
    return file


_POOL: Final = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
_CLASSES: Final[dict[str, type[Message]]] = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    for name in MESSAGES
}


def message_class(name: str) -> type[Any]:
    """The protobuf class of message ``name`` (``"ModelInferRequest"``)."""
    return _CLASSES[name]
