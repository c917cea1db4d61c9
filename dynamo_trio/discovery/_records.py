"""The records the runtime keeps in discovery, their keys and their encoding.

docs/discovery.md, "Records", has the layout and why it is versioned and validated twice.
"""

from __future__ import annotations

from typing import Any, Final, Literal
from urllib.parse import quote

import msgspec

from .._hostport import parse_address
from ._base import DiscoveryError

ModelType = Literal["chat", "completions", "embeddings", "tensor", "images", "videos", "audios"]

TENSOR_DATA_TYPES: Final = {
    "BOOL": "Bool",
    "UINT8": "Uint8",
    "UINT16": "Uint16",
    "UINT32": "Uint32",
    "UINT64": "Uint64",
    "INT8": "Int8",
    "INT16": "Int16",
    "INT32": "Int32",
    "INT64": "Int64",
    "FP16": "Float16",
    "BF16": "BFloat16",
    "FP32": "Float32",
    "FP64": "Float64",
    "BYTES": "Bytes",
}
"""The tensor datatypes served: KServe's name to a worker's (Dynamo's) name."""

_DYNAMO_DATA_TYPES: Final = frozenset(TENSOR_DATA_TYPES.values())


class InvalidRecord(DiscoveryError, ValueError):
    """A discovery value could not be decoded into the expected record."""


def _check_segments(**segments: str) -> None:
    for what, value in segments.items():
        if not value:
            raise ValueError(f"{what} must not be empty")
        if "/" in value:
            raise ValueError(f"{what} must not contain '/': {value!r}")


def _check_instance_id(instance_id: int) -> None:
    if not 0 < instance_id < 2**63:
        raise ValueError(f"instance_id must be a positive 63-bit integer, not {instance_id}")


class Instance(msgspec.Struct, frozen=True):
    """One worker process serving one endpoint, at ``address`` (``host:port``) on the request plane.

    Names hold no ``/``; ``instance_id`` is the worker's lease id.
    """

    namespace: str
    component: str
    endpoint: str
    instance_id: int
    address: str

    def __post_init__(self) -> None:
        _check_segments(namespace=self.namespace, component=self.component, endpoint=self.endpoint)
        _check_instance_id(self.instance_id)
        try:
            port = parse_address(self.address)[1]
        except ValueError:
            port = 0
        if not 0 < port <= 65535:
            raise ValueError(f"address must be 'host:port', not {self.address!r}")

    @property
    def key(self) -> str:
        prefix = instance_prefix(self.namespace, self.component, self.endpoint)
        return f"{prefix}{self.instance_id:x}"


class TensorSpec(msgspec.Struct, frozen=True):
    """One input or output of a tensor model: its name, datatype (a worker's name,
    ``"Int32"``) and shape (``-1``: any size in that dimension)."""

    name: str
    data_type: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tensor's name must not be empty")
        if self.data_type not in _DYNAMO_DATA_TYPES:
            raise ValueError(
                f"tensor {self.name!r}: datatype {self.data_type!r} is not one of "
                f"{sorted(_DYNAMO_DATA_TYPES)}"
            )
        if any(dim < -1 for dim in self.shape):
            raise ValueError(f"tensor {self.name!r}: invalid shape {list(self.shape)}")


class TensorModelConfig(msgspec.Struct, frozen=True):
    """What a tensor model takes and gives (Dynamo's ``tensor_model_config``)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TensorModelConfig:
        """From Dynamo's dict form (datatypes may be KServe's, ``"INT32"``); else ValueError."""

        def spec(tensor: dict[str, Any]) -> TensorSpec:
            data_type = str(tensor["data_type"])
            return TensorSpec(
                name=str(tensor["name"]),
                data_type=TENSOR_DATA_TYPES.get(data_type, data_type),
                shape=tuple(int(dim) for dim in tensor["shape"]),
            )

        try:
            return cls(
                name=str(config["name"]),
                inputs=tuple(spec(tensor) for tensor in config["inputs"]),
                outputs=tuple(spec(tensor) for tensor in config["outputs"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid tensor_model_config: {exc!r}") from None


class ModelCard(msgspec.Struct, frozen=True):
    """A model (``name`` may hold ``/``) served by one instance of an endpoint.

    ``context_length`` counts prompt plus output tokens; ``accepts_continuation``:
    the engine honours a generate request's ``continuation``, so the frontend may
    migrate an interrupted request to it.
    """

    name: str
    model_type: ModelType
    namespace: str
    component: str
    endpoint: str
    instance_id: int
    context_length: int | None = None
    max_output_tokens: int | None = None
    accepts_continuation: bool = False
    tensor_model_config: TensorModelConfig | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model name must not be empty")
        _check_segments(namespace=self.namespace, component=self.component, endpoint=self.endpoint)
        _check_instance_id(self.instance_id)
        for what in ("context_length", "max_output_tokens"):
            if (value := getattr(self, what)) is not None and value <= 0:
                raise ValueError(f"{what} must be positive, not {value}")

    @property
    def key(self) -> str:
        name = quote(self.name, safe="")
        return f"{model_prefix(self.namespace)}{name}/{self.model_type}/{self.instance_id:x}"


def instance_prefix(namespace: str, component: str, endpoint: str) -> str:
    """Where every :class:`Instance` of one endpoint is stored (ValueError for a bad name)."""
    _check_segments(namespace=namespace, component=component, endpoint=endpoint)
    return f"v1/instances/{namespace}/{component}/{endpoint}/"


def model_prefix(namespace: str) -> str:
    """Where every :class:`ModelCard` of a namespace is stored (ValueError for a bad name)."""
    _check_segments(namespace=namespace)
    return f"v1/models/{namespace}/"


_encoder = msgspec.json.Encoder()
_instance_decoder = msgspec.json.Decoder(Instance)
_model_card_decoder = msgspec.json.Decoder(ModelCard)


def encode_record(record: Instance | ModelCard) -> bytes:
    """Encode a record as the JSON value stored under ``record.key``."""
    return _encoder.encode(record)


def decode_instance(data: bytes) -> Instance:
    """Decode and validate an :class:`Instance` (:class:`InvalidRecord` if it is not one)."""
    try:
        return _instance_decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise InvalidRecord(f"invalid instance record: {exc}") from None


def decode_model_card(data: bytes) -> ModelCard:
    """Decode and validate a :class:`ModelCard` (:class:`InvalidRecord` if it is not one)."""
    try:
        return _model_card_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidRecord(f"invalid model card: {exc}") from None
