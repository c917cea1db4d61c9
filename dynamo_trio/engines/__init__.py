"""Real engines in trio workers: the two bridges, and the workers built on them.

Layout (each module has one job):

- ``_asyncio``: an asyncio event loop in a thread of its own, and the adapter
  from an asyncio engine's per-request async generator plus its ``abort``
  hook to a trio async generator (vLLM, SGLang);
- ``_thread``: the adapter from blocking engine code stepping in a thread
  (transformers, llama.cpp bindings) to a trio async generator;
- ``_transformers``: ``python -m dynamo_trio transformers --model DIR``;
- ``_vllm``: ``python -m dynamo_trio vllm --model DIR``.

The engine libraries (torch, transformers, vllm) are imported only by the
worker modules, when a worker starts: this package imports without them.
"""

from ._asyncio import AsyncioLoop, open_asyncio_loop
from ._thread import Abandoned, Emit, StopFlag, iterate_in_thread, stream_from_thread

__all__ = [
    "Abandoned",
    "AsyncioLoop",
    "Emit",
    "StopFlag",
    "iterate_in_thread",
    "open_asyncio_loop",
    "stream_from_thread",
]
