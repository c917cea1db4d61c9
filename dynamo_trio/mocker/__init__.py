"""The mock LLM engine, for testing the runtime and frontend without a model:
``MockEngine(settings).generate`` and ``.embed`` are endpoint handlers speaking the engine
protocol of :mod:`dynamo_trio.llm`; ``MediaEngine(settings)``'s ``.images``, ``.videos`` and
``.speech`` serve the media models."""

from ._engine import MockEngine
from ._media import MediaEngine
from ._settings import MockerSettings
from ._text import VOCABULARY, TokenSource, count_tokens, render_prompt

__all__ = [
    "VOCABULARY",
    "MediaEngine",
    "MockEngine",
    "MockerSettings",
    "TokenSource",
    "count_tokens",
    "render_prompt",
]
