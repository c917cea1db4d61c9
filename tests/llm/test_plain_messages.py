"""A plain message (an object with a known role and string content) is read on a fast
path; the parsers must give it the same answer as their checked path would."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, strategies as st

from dynamo_trio.llm import (
    RequestError,
    parse_chat_request,
    parse_messages_request,
    parse_responses_request,
)

if TYPE_CHECKING:
    from collections.abc import Callable


class _Mapping(dict):  # type: ignore[type-arg]
    """A JSON object that is not exactly a dict: it takes the checked path, never the fast one."""


_ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot", "", "User"])
_VALUE = st.one_of(
    st.text(max_size=5),
    st.none(),
    st.integers(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=3)})),
)
_TYPE = st.sampled_from(["message", "", "function_call", "Message"])
_MESSAGE = st.one_of(
    st.fixed_dictionaries(  # one that looks plain, and an extra field or two
        {"role": _ROLE, "content": st.text(max_size=5)},
        optional={"type": st.one_of(_TYPE, st.none(), st.integers()), "name": _VALUE},
    ),
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "type"]), st.one_of(_ROLE, _TYPE, _VALUE)
    ),
    _VALUE,
)

_PARSERS: dict[str, Callable[[list[object]], Any]] = {
    "chat": lambda messages: parse_chat_request({"model": "m", "messages": messages}),
    "anthropic": lambda messages: parse_messages_request(
        {"model": "m", "max_tokens": 1, "messages": messages}
    ),
    "responses": lambda messages: parse_responses_request({"model": "m", "input": messages}),
}


@pytest.mark.parametrize("api", sorted(_PARSERS))
@given(message=_MESSAGE)
def test_a_message_is_read_the_same_by_the_fast_path_and_the_checked_one(
    api: str, message: Any
) -> None:
    def outcome(value: object) -> object:
        try:
            return _PARSERS[api]([value]).messages
        except RequestError as exc:
            return (exc.status, exc.param, str(exc))

    checked = _Mapping(message) if isinstance(message, dict) else message
    assert outcome(message) == outcome(checked)
