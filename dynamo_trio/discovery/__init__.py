"""Discovery: where workers register and where clients find them.

Three backends share one contract (:class:`Discovery`): ``mem``, ``file`` (the
default) and ``etcd``; :func:`open_discovery` picks one, :func:`view_prefix`
keeps a live decoded view of a prefix, :mod:`._records` defines the runtime's
records.  docs/discovery.md has the contract and how each backend keeps it.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._base import Discovery, DiscoveryError
from ._file import FileDiscovery
from ._memory import MemoryDiscovery, MemoryStore, default_memory_store
from ._open import make_discovery, open_discovery
from ._records import (
    TENSOR_DATA_TYPES,
    Instance,
    InvalidRecord,
    ModelCard,
    ModelType,
    TensorModelConfig,
    TensorSpec,
    decode_instance,
    decode_model_card,
    encode_record,
    instance_prefix,
    model_prefix,
)
from ._view import PrefixView, view_prefix
from ._watch import Watch, WatchEvent

if _TYPE_CHECKING:
    from ._etcd import EtcdDiscovery


def __getattr__(name: str) -> object:
    # EtcdDiscovery is loaded on first use: it brings httpx, which processes on
    # the file or mem backends never need (start-up time and memory).
    if name == "EtcdDiscovery":
        from ._etcd import EtcdDiscovery

        return EtcdDiscovery
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Discovery",
    "DiscoveryError",
    "EtcdDiscovery",
    "FileDiscovery",
    "Instance",
    "InvalidRecord",
    "MemoryDiscovery",
    "MemoryStore",
    "ModelCard",
    "ModelType",
    "PrefixView",
    "TENSOR_DATA_TYPES",
    "TensorModelConfig",
    "TensorSpec",
    "Watch",
    "WatchEvent",
    "decode_instance",
    "decode_model_card",
    "default_memory_store",
    "encode_record",
    "instance_prefix",
    "make_discovery",
    "model_prefix",
    "open_discovery",
    "view_prefix",
]
