"""decode_json_body: strict JSON with a depth limit, no repeated keys, 64-bit integers.

The properties are checked against independent models: Python's ``json``
(with ``object_pairs_hook`` to see repeated keys) for what a text means, and
a recursive depth function for nesting.  Texts are written by a randomized
encoder (random whitespace, random escapes, ``\\u`` escapes of ``:``, ``"``,
``\\``, brackets, surrogate pairs), so the skeleton the decoder builds meets
every way a string can hide a separator or a bracket.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from dynamo_trio.llm import INTEGER_RANGE, RequestError, decode_json_body
from tests._fuzz import examples

LOW, HIGH = INTEGER_RANGE

# ---------------------------------------------------------------------------- models


def depth(value: object) -> int:
    """Nesting depth: a scalar 0, ``[]``/``{}`` 1."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def repeated_key(text: bytes) -> str | None:
    found: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        for key in keys:
            if keys.count(key) > 1 and not found:
                found.append(key)
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook)
    return found[0] if found else None


# ---------------------------------------------------------------------------- a random encoder

_SPECIAL = ':"\\[]{},\u2028\U0001f600\x00\x1f'

keys = st.text(alphabet=st.sampled_from("ab:" + _SPECIAL), max_size=4)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=LOW, max_value=HIGH)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(_SPECIAL), max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=30,
)


def encode_string(text: str, data: st.DataObject) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\' or code < 0x20:
            out.append(json.dumps(char)[1:-1])
        elif data.draw(st.integers(0, 3)) == 0:  # escape anything, sometimes
            if code > 0xFFFF:
                high, low = divmod(code - 0x10000, 0x400)
                out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04X}")
            else:
                out.append(f"\\u{code:04x}" if data.draw(st.booleans()) else f"\\u{code:04X}")
        elif char == "/" and data.draw(st.booleans()):
            out.append("\\/")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def encode(value: object, data: st.DataObject) -> str:
    space = data.draw(st.sampled_from(["", " ", "\n", "\t ", "\r\n  "]))
    if isinstance(value, dict):
        items = [
            f"{encode_string(k, data)}{space}:{space}{encode(v, data)}" for k, v in value.items()
        ]
        return "{" + space + ("," + space).join(items) + space + "}"
    if isinstance(value, list):
        return "[" + space + ("," + space).join(encode(v, data) for v in value) + space + "]"
    if isinstance(value, str):
        return encode_string(value, data)
    return json.dumps(value)


# ---------------------------------------------------------------------------- properties


@given(values, st.data())
@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
def test_any_json_text_decodes_to_its_value(value: object, data: st.DataObject) -> None:
    text = encode(value, data).encode()
    assert json.loads(text) == value  # the encoder is right
    if depth(value) > 64:
        return
    assert decode_json_body(text, max_depth=64) == value


@given(values, st.integers(1, 6), st.data())
@settings(max_examples=examples(150))
def test_depth_is_refused_exactly_above_the_limit(
    value: object, max_depth: int, data: st.DataObject
) -> None:
    text = encode(value, data).encode()
    if depth(value) <= max_depth:
        assert decode_json_body(text, max_depth=max_depth) == value
    else:
        with pytest.raises(RequestError) as caught:
            decode_json_body(text, max_depth=max_depth)
        assert caught.value.status == 400
        assert f"more than {max_depth} levels deep" in caught.value.message


@given(st.dictionaries(keys, values, min_size=1, max_size=4), st.data())
@settings(max_examples=examples(150))
def test_a_key_given_twice_is_refused_and_named(obj: dict[str, Any], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    duplicate = encode_string(key, data) + ":" + encode(data.draw(values), data)
    where = data.draw(st.sampled_from(["top", "nested", "in-array"]))
    inner = encode(obj, data)
    inner = "{" + duplicate + "," + inner[1:] if inner.strip() != "{}" else "{" + duplicate + "}"
    text = {
        "top": inner,
        "nested": '{"outer": ' + inner + "}",
        "in-array": "[1, " + inner + ', {"x": 2}]',
    }[where].encode()
    named = repeated_key(text)
    if named is None:  # the encoded keys differ only in escapes: json says it is one key
        named = key
    with pytest.raises(RequestError) as caught:
        decode_json_body(text, max_depth=64)
    assert caught.value.status == 400
    assert f"the key {named!r} appears more than once" in caught.value.message


@given(values, st.data())
@settings(max_examples=examples(150))
def test_no_repeated_key_is_reported_where_there_is_none(
    value: object, data: st.DataObject
) -> None:
    text = encode(value, data).encode()
    assume(depth(value) <= 64)
    assert repeated_key(text) is None
    decode_json_body(text, max_depth=64)


@given(
    st.one_of(st.integers(max_value=LOW - 1), st.integers(min_value=HIGH + 1)),
    st.sampled_from(["top", "seed", "nested", "array", "long-array", "objects"]),
)
@example(LOW - 1, "seed")
@example(HIGH + 1, "seed")
@example(10**400, "long-array")
def test_an_integer_outside_64_bits_is_refused_naming_its_path(number: int, where: str) -> None:
    body, param = {
        "top": ([number], "[0]"),
        "seed": ({"model": "m", "seed": number}, "seed"),
        "nested": ({"a": [{"b": 1}, {"c": number}]}, "a[1].c"),
        "array": ({"xs": [1, 2, number]}, "xs[2]"),
        "long-array": ({"xs": [*range(40), number, 1.5]}, "xs[40]"),
        "objects": ({"messages": [{"role": "user"}] * 20 + [{"n": number}]}, "messages[20].n"),
    }[where]
    with pytest.raises(RequestError) as caught:
        decode_json_body(json.dumps(body).encode(), max_depth=64)
    assert (caught.value.status, caught.value.param, caught.value.code) == (
        400,
        param,
        "invalid_value",
    )
    assert "between -2**63 and 2**64-1" in caught.value.message


@given(st.lists(st.dictionaries(keys, scalars, max_size=3), min_size=17, max_size=40), st.data())
@settings(max_examples=examples(50))
def test_a_long_run_of_objects_is_checked_as_any_other(
    objects: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Chat messages, say: checked in bulk, with the same answers as one by one."""
    text = encode({"messages": objects}, data).encode()
    assert decode_json_body(text, max_depth=3) == {"messages": objects}  # objects at depth 3
    with pytest.raises(RequestError, match="more than 2 levels deep"):
        decode_json_body(text, max_depth=2)
    with pytest.raises(RequestError, match="more than 3 levels deep"):
        decode_json_body(b"[" + text + b"]", max_depth=3)
    at = data.draw(st.integers(0, len(objects) - 1))
    parts = [json.dumps(obj) for obj in objects]
    parts[at] = '{"k": 1, "k": 2' + (", " + parts[at][1:] if objects[at] else "}")
    twice = ('{"messages": [' + ", ".join(parts) + "]}").encode()
    with pytest.raises(RequestError, match="more than once"):
        decode_json_body(twice, max_depth=3)


def test_the_integer_range_itself_is_accepted() -> None:
    body = {"xs": [LOW, HIGH, *range(40)], "a": LOW, "b": HIGH, "c": 1e300, "d": -1e300}
    assert decode_json_body(json.dumps(body).encode(), max_depth=64) == body


@given(st.binary(max_size=300))
@settings(max_examples=examples(500))
def test_any_bytes_decode_or_give_a_400(body: bytes) -> None:
    outcome = decode_or_error(body, max_depth=8)
    if isinstance(outcome, RequestError):
        assert outcome.status == 400
        assert outcome.message


@given(values, st.data())
@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
def test_any_mutation_of_json_decodes_or_gives_a_400(value: object, data: st.DataObject) -> None:
    text = bytearray(encode(value, data).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        byte = data.draw(st.sampled_from(list(b'"\\:[]{},0eE-.\xff\xed\xc0 nNuI')))
        if action == "insert":
            text.insert(at, byte)
        elif at < len(text):
            if action == "delete":
                del text[at]
            else:
                text[at] = byte
    outcome = decode_or_error(bytes(text), max_depth=64)
    if isinstance(outcome, RequestError):
        assert outcome.status == 400
    else:
        # Whatever is accepted is what a strict reader reads, with no key twice.
        assert outcome == json.loads(bytes(text), parse_constant=_refuse)
        assert repeated_key(bytes(text)) is None


def decode_or_error(body: bytes, *, max_depth: int) -> object:
    """The decoded value, or the RequestError (any other exception fails the test)."""
    try:
        return decode_json_body(body, max_depth=max_depth)
    except RequestError as exc:
        return exc


def _refuse(name: str) -> float:
    raise AssertionError(f"{name} was accepted")


# ---------------------------------------------------------------------------- messages


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", "the body is empty"),
        (b" \n ", "the body is empty"),
        (b'{"model": "m",', "it ends before the JSON value does"),
        (b'{"a": "\xff"}', "it is not UTF-8 (invalid byte at byte 7)"),
        (b'{"a": "\xed\xa0\x80"}', "it is not UTF-8"),  # a surrogate, UTF-8 encoded
        (b'["\\ud800"]', "the escape \\ud800 at byte 2 is half of a UTF-16 surrogate pair"),
        (b'["\\ud800\\u0041"]', "the escape \\ud800 at byte 2 is half"),
        (b'["x\\udfff"]', "the escape \\udfff at byte 3 is half"),
        (b"NaN", "NaN and Infinity are not JSON numbers (byte 0)"),
        (b"[1e400]", "a number is too large to represent"),
        (b'{"a": 1,}', "trailing comma in object"),
        (b'{"a": 1} {}', "trailing characters"),
        (b"{'a': 1}", "object keys must be strings"),
    ],
)
def test_malformed_bodies_say_what_is_wrong(body: bytes, expected: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode_json_body(body, max_depth=64)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, None, None)
    assert error.message.startswith("The request body is not valid JSON: ")
    assert expected in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"temperature": NaN}', "temperature"),
        (b'{"a": [1, {"b": -Infinity}]}', "a[1].b"),
        (b'{"top_p": Infinity}', "top_p"),
    ],
)
def test_nan_and_infinity_name_their_parameter(body: bytes, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode_json_body(body, max_depth=64)
    assert (caught.value.param, caught.value.code) == (param, "invalid_value")
    assert f"Invalid value for '{param}': NaN and Infinity are not JSON numbers" in (
        caught.value.message
    )


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b"1," * 30_000 + b"NaN]",  # past the values searched
        b'{"a": "' + b"x" * (1 << 20) + b'", "b": NaN}',  # past the bytes searched
    ],
)
def test_a_nan_deep_in_a_large_body_is_refused_without_its_path(body: bytes) -> None:
    """Naming the path takes a lenient decode and a walk: bounded, so that a large body
    cannot hold the event loop for seconds; the message still says where (a byte offset)."""
    with pytest.raises(RequestError) as caught:
        decode_json_body(body, max_depth=64)
    assert (caught.value.status, caught.value.param) == (400, None)
    assert "NaN and Infinity are not JSON numbers (byte" in caught.value.message


def test_a_lone_surrogate_is_named_in_a_body_of_at_most_a_mebibyte() -> None:
    small = b'["' + b"a" * 1000 + b'\\ud800"]'
    large = b'["' + b"a" * (1 << 20) + b'\\ud800"]'
    for body, named in ((small, True), (large, False)):
        with pytest.raises(RequestError) as caught:
            decode_json_body(body, max_depth=64)
        assert caught.value.status == 400
        assert ("half of a UTF-16 surrogate pair" in caught.value.message) is named


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
@pytest.mark.parametrize("levels", [65, 1_000, 100_000])
def test_deep_nesting_is_a_400_not_a_recursion_error(opener: bytes, levels: int) -> None:
    closer = b"]" if opener == b"[" else b"}"
    body = opener * levels + b"1" + closer * levels
    with pytest.raises(RequestError) as caught:
        decode_json_body(body, max_depth=64)
    assert caught.value.message == (
        "The request body nests arrays and objects more than 64 levels deep; "
        "this server accepts at most 64."
    )


def test_deep_and_unterminated_is_still_a_400() -> None:
    with pytest.raises(RequestError) as caught:
        decode_json_body(b"[" * 100_000, max_depth=64)
    assert caught.value.status == 400


def test_brackets_and_colons_inside_strings_do_not_count() -> None:
    body = {"a": "[[[[[[[[[[" * 20, "b": "::::", 'c"\\:': ["}}}", "{{{"], "d\\": "\\"}
    text = json.dumps(body).encode()
    assert decode_json_body(text, max_depth=2) == body
    escaped = text.replace(b"::::", b"\\u003a:\\u003A:")
    assert decode_json_body(escaped, max_depth=2) == body


def test_scalars_and_large_flat_arrays() -> None:
    assert decode_json_body(b" 5 ", max_depth=1) == 5
    assert decode_json_body(b'"s"', max_depth=1) == "s"
    assert decode_json_body(b"null", max_depth=1) is None
    flat = list(range(100_000))
    assert decode_json_body(json.dumps(flat).encode(), max_depth=1) == flat
    mixed = ["a", 1.5, True, None, *range(50)]
    assert decode_json_body(json.dumps(mixed).encode(), max_depth=1) == mixed
    assert math.isclose(decode_json_body(b"[1.5e308]", max_depth=1)[0], 1.5e308)  # type: ignore[index]
