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
from ._watch import PrefixView, Watch, WatchEvent, view_prefix

if _TYPE_CHECKING:
    from .._config import DiscoveryConfig
    from ._etcd import EtcdDiscovery


def __getattr__(name: str) -> object:
    # EtcdDiscovery is loaded on first use: it brings httpx, which processes on
    # the file or mem backends never need (start-up time and memory).
    if name == "EtcdDiscovery":
        from ._etcd import EtcdDiscovery

        return EtcdDiscovery
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_discovery(
    config: "DiscoveryConfig", *, memory_store: MemoryStore | None = None
) -> Discovery:
    """The backend named by ``config.backend`` (``mem`` uses ``memory_store``), not started yet:
    it holds a lease while its context (``async with``) lasts."""
    match config.backend:
        case "mem":
            return MemoryDiscovery(
                memory_store, lease_ttl=config.lease_ttl, max_record_size=config.max_record_size
            )
        case "file":
            return FileDiscovery(config)
        case "etcd":
            from ._etcd import EtcdDiscovery

            return EtcdDiscovery(config)
        case other:
            raise ValueError(f"unknown discovery backend {other!r} (mem, file or etcd)")


make_discovery = open_discovery  # the same: named for building one without entering it


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
