"""``python -m dynamo_trio.frontend``: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

from ._main import main

if __name__ == "__main__":
    main()
