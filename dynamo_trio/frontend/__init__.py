"""The OpenAI-compatible HTTP frontend, with client hang-ups cancelling work downstream:
``python -m dynamo_trio.frontend`` (``dynamo-trio frontend``), or :func:`serve_frontend`
inside an open :class:`~dynamo_trio.runtime.DistributedRuntime`.
"""

from ._app import build_app, build_edge, serve_frontend
from ._pipeline import Pipeline

__all__ = ["Pipeline", "build_app", "build_edge", "serve_frontend"]
