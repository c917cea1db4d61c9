"""``python -m dynamo_trio.mocker --model-name NAME``: a mock LLM worker."""

from __future__ import annotations

from ._main import main

if __name__ == "__main__":
    main()
