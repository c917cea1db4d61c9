"""Records: keys, validation, and encoding round trips."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, strategies as st

from dynamo_trio.discovery import (
    Instance,
    InvalidRecord,
    ModelCard,
    ModelType,
    decode_instance,
    decode_model_card,
    encode_record,
    instance_prefix,
    model_prefix,
)

segments = st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s)
instance_ids = st.integers(min_value=1, max_value=2**63 - 1)


def test_instance_key_and_prefix() -> None:
    instance = Instance("dynamo", "backend", "generate", 0xABC, "10.0.0.7:4100")
    assert instance.key == "v1/instances/dynamo/backend/generate/abc"
    assert (
        instance_prefix("dynamo", "backend", "generate") == "v1/instances/dynamo/backend/generate/"
    )
    assert instance.key.startswith(instance_prefix("dynamo", "backend", "generate"))


def test_model_names_with_slashes_are_escaped_in_the_key_only() -> None:
    card = ModelCard("Qwen/Qwen3-0.6B", "chat", "dynamo", "backend", "generate", 0x1F)
    assert card.key == "v1/models/dynamo/Qwen%2FQwen3-0.6B/chat/1f"
    assert card.key.startswith(model_prefix("dynamo"))
    assert decode_model_card(encode_record(card)).name == "Qwen/Qwen3-0.6B"
    percent = ModelCard("50%/off", "completions", "ns", "c", "e", 1)
    assert percent.key == "v1/models/ns/50%25%2Foff/completions/1"


def test_values_are_readable_json() -> None:
    instance = Instance("ns", "c", "e", 1, "[::1]:80")
    assert msgspec.json.decode(encode_record(instance)) == {
        "namespace": "ns",
        "component": "c",
        "endpoint": "e",
        "instance_id": 1,
        "address": "[::1]:80",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"namespace": ""}, "namespace must not be empty"),
        ({"component": "a/b"}, "component must not contain"),
        ({"endpoint": ""}, "endpoint must not be empty"),
        ({"instance_id": 0}, "positive 63-bit"),
        ({"instance_id": 2**63}, "positive 63-bit"),
        ({"address": "no-port"}, "host:port"),
        ({"address": "host:99999"}, "host:port"),
        ({"address": ":80"}, "host:port"),
    ],
)
def test_invalid_instances_are_refused(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "namespace": "ns",
        "component": "c",
        "endpoint": "e",
        "instance_id": 1,
        "address": "h:1",
    }
    fields.update(kwargs)
    with pytest.raises(ValueError, match=message):
        Instance(**fields)  # type: ignore[arg-type]
    # ... and the same record read back from discovery is refused too
    with pytest.raises(InvalidRecord, match=message):
        decode_instance(msgspec.json.encode(fields))


def test_invalid_model_cards_are_refused() -> None:
    with pytest.raises(ValueError, match="model name"):
        ModelCard("", "chat", "ns", "c", "e", 1)
    with pytest.raises(ValueError, match="context_length"):
        ModelCard("m", "chat", "ns", "c", "e", 1, context_length=0)
    with pytest.raises(InvalidRecord, match="model_type"):
        decode_model_card(
            b'{"name":"m","model_type":"audio","namespace":"ns",'
            b'"component":"c","endpoint":"e","instance_id":1}'
        )
    with pytest.raises(ValueError, match="must not contain"):
        model_prefix("a/b")
    with pytest.raises(ValueError, match="must not be empty"):
        instance_prefix("ns", "", "e")


@pytest.mark.parametrize(
    "data", [b"", b"not json", b"[]", b"{}", b'{"namespace": 1}', b"\xff\xfe", b"null"]
)
def test_garbage_is_an_invalid_record(data: bytes) -> None:
    with pytest.raises(InvalidRecord):
        decode_instance(data)
    with pytest.raises(InvalidRecord):
        decode_model_card(data)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    data = (
        b'{"namespace":"ns","component":"c","endpoint":"e","instance_id":1,"address":"h:1","x":2}'
    )
    assert decode_instance(data) == Instance("ns", "c", "e", 1, "h:1")


@given(
    namespace=segments,
    component=segments,
    endpoint=segments,
    instance_id=instance_ids,
    port=st.integers(min_value=1, max_value=65535),
)
def test_instances_round_trip(
    namespace: str, component: str, endpoint: str, instance_id: int, port: int
) -> None:
    instance = Instance(namespace, component, endpoint, instance_id, f"host:{port}")
    assert decode_instance(encode_record(instance)) == instance
    prefix = instance_prefix(namespace, component, endpoint)
    assert instance.key.startswith(prefix)
    assert "/" not in instance.key.removeprefix(prefix)


@given(
    name=st.text(min_size=1, max_size=40),
    model_type=st.sampled_from(["chat", "completions", "embeddings"]),
    namespace=segments,
    instance_id=instance_ids,
    context_length=st.none() | st.integers(min_value=1, max_value=10**7),
    accepts_continuation=st.booleans(),
)
def test_model_cards_round_trip(
    name: str,
    model_type: ModelType,
    namespace: str,
    instance_id: int,
    context_length: int | None,
    accepts_continuation: bool,
) -> None:
    card = ModelCard(
        name,
        model_type,
        namespace,
        "c",
        "e",
        instance_id,
        context_length,
        accepts_continuation=accepts_continuation,
    )
    assert decode_model_card(encode_record(card)) == card
    rest = card.key.removeprefix(model_prefix(namespace))
    assert rest.count("/") == 2, "the model name must stay one key segment"
