"""The OpenAI-compatible HTTP frontend, with client hang-ups cancelling work downstream.

Run it with ``python -m dynamo_trio.frontend`` (or ``dynamo-trio frontend``), or
embed it with :func:`serve_frontend` inside an open
:class:`~dynamo_trio.runtime.DistributedRuntime`.
"""

from ._app import build_app, build_edge, serve_frontend
from ._pipeline import Pipeline

__all__ = ["Pipeline", "build_app", "build_edge", "serve_frontend"]
