"""``python -m dynamo_trio.frontend``: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

from ..cli import frontend_main

if __name__ == "__main__":
    frontend_main()
