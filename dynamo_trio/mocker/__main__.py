"""``python -m dynamo_trio.mocker --model-name NAME``: a mock LLM worker."""

from __future__ import annotations

from ..cli import mocker_main

if __name__ == "__main__":
    mocker_main()
