"""``python -m dynamo_trio COMMAND``: the ``dynamo-trio`` command (see ``cli``)."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
