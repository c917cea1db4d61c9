"""``python -m dynamo_trio {run,frontend,mocker}``: the ``dynamo-trio`` command."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
