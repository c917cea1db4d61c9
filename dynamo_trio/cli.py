"""The ``dynamo-trio`` command: ``argv[1]`` names the subcommand, whose ``main`` is
imported only then, so that a command loads only what it runs.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

COMMANDS: Final = {
    "run": ("dynamo_trio._run", "main", "a frontend and N mock workers on this machine"),
    "frontend": ("dynamo_trio.frontend._main", "main", "the OpenAI-compatible HTTP frontend"),
    "mocker": ("dynamo_trio.mocker._main", "main", "a mock LLM worker"),
    "transformers": (
        "dynamo_trio.engines._commands",
        "transformers_main",
        "a worker serving a Hugging Face transformers checkpoint",
    ),
    "vllm": (
        "dynamo_trio.engines._commands",
        "vllm_main",
        "a worker serving a checkpoint with vLLM",
    ),
}
"""Each subcommand: the module and function of its ``main``, and what it runs."""


def main(argv: Sequence[str] | None = None) -> None:
    """The ``dynamo-trio`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        asked = argv[:1] in (["-h"], ["--help"])
        lines = [f"  {name:<13} {doc}" for name, (_, _, doc) in COMMANDS.items()]
        print(
            f"usage: dynamo-trio {{{','.join(COMMANDS)}}} [options]\n\n"
            + "\n".join(lines)
            + "\n\n`dynamo-trio COMMAND --help` for a command's options.",
            file=sys.stdout if asked else sys.stderr,
        )
        raise SystemExit(0 if asked else 2)
    module, function, _ = COMMANDS[argv[0]]
    getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == "__main__":
    main()
