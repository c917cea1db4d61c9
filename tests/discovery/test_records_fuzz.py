"""Every discovery parser, fed anything: a record or a clear rejection, never another exception.

Records come from a store anyone on the machine (file) or the cluster (etcd)
can write, so the decoders are fuzzed with arbitrary bytes and with JSON
objects that have the right field names and wrong-typed or out-of-range values
(what a confused or hostile writer would produce).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dynamo_trio.discovery import (
    Instance,
    InvalidRecord,
    ModelCard,
    decode_instance,
    decode_model_card,
    encode_record,
)
from dynamo_trio.discovery._file_store import parse_entry, parse_lease
from tests._fuzz import examples

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["", "/", "a/b", "chat", "embeddings", "h:1", "[::1]:80", "\x00", "🙂"])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)


def objects_with(fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects with (some of) ``fields``, each any JSON value or a plausible one."""
    plausible = {
        "instance_id": st.integers(min_value=-5, max_value=2**64),
        "lease": st.integers(min_value=-5, max_value=2**64),
        "context_length": st.none() | st.integers(min_value=-5, max_value=2**64),
        "model_type": st.sampled_from(["chat", "completions", "embeddings", "audio", ""]),
        "address": st.from_regex(r"[a-z0-9.:\[\]]{0,12}:[0-9]{0,6}", fullmatch=True),
        "ttl": st.floats(allow_nan=False) | st.integers(),
        "value": st.text(max_size=12),
    }
    values = {name: plausible.get(name, st.text(max_size=12)) | json_values for name in fields}
    # Every field present (so the validation behind the decoder is reached), or any subset.
    return st.fixed_dictionaries(values) | st.fixed_dictionaries({}, optional=values)


INSTANCE_FIELDS = ["namespace", "component", "endpoint", "instance_id", "address"]
CARD_FIELDS = [
    "name",
    "model_type",
    "namespace",
    "component",
    "endpoint",
    "instance_id",
    "context_length",
]


def payloads(fields: list[str]) -> st.SearchStrategy[bytes]:
    return (
        st.binary(max_size=200)
        | objects_with(fields).map(msgspec.json.encode)
        | st.builds(
            lambda d, junk: msgspec.json.encode(d) + junk,
            objects_with(fields),
            st.binary(max_size=4),
        )
    )


@given(payloads(INSTANCE_FIELDS))
@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
def test_instance_decoding_never_fails_unexpectedly(data: bytes) -> None:
    try:
        instance = decode_instance(data)
    except InvalidRecord:
        return
    assert isinstance(instance, Instance)
    assert 0 < instance.instance_id < 2**63
    assert instance.key.endswith(f"/{instance.instance_id:x}")
    assert decode_instance(encode_record(instance)) == instance


@given(payloads(CARD_FIELDS))
@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
def test_model_card_decoding_never_fails_unexpectedly(data: bytes) -> None:
    try:
        card = decode_model_card(data)
    except InvalidRecord:
        return
    assert isinstance(card, ModelCard)
    assert card.name
    assert card.model_type in ("chat", "completions", "embeddings")
    assert card.context_length is None or card.context_length > 0
    assert card.key.count("/") == 5, card.key  # the name stays one segment
    assert decode_model_card(encode_record(card)) == card


@given(payloads(["key", "lease", "value"]), st.text(max_size=20))
@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
def test_file_entry_decoding_never_fails_unexpectedly(data: bytes, name: str) -> None:
    for found_under in (None, name):
        try:
            entry = parse_entry(data, found_under)
        except ValueError:  # msgspec.DecodeError is one
            continue
        assert isinstance(entry.key, str)
        assert "\0" not in entry.key
        assert isinstance(entry.value, bytes)


@given(payloads(["ttl", "pid"]) | st.floats().map(lambda ttl: b'{"ttl": %r}' % ttl))
@settings(max_examples=examples(200))
def test_lease_file_decoding_never_fails_unexpectedly(data: bytes) -> None:
    try:
        ttl = parse_lease(data)
    except ValueError:
        return
    assert math.isfinite(ttl)
    assert ttl > 0


@pytest.mark.parametrize(
    "data",
    [
        b'{"key": "k", "lease": 1, "value": "not base64!"}',
        b'{"key": "k\\u0000x", "lease": 1, "value": ""}',
        b'{"key": "\\ud800", "lease": 1, "value": ""}',
        b'{"key": "k", "lease": 1e400, "value": ""}',
        b'{"key": "k", "lease": 99999999999999999999999999, "value": ""}',
        b"[" * 10_000,
    ],
)
def test_hostile_entries_are_refused_clearly(data: bytes) -> None:
    try:
        entry = parse_entry(data, "k")
    except ValueError:
        return
    # A huge lease number decodes, and simply never names a live lease.
    assert entry.lease > 2**64
