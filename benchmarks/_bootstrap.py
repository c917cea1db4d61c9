"""Run a benchmark under a Python that has the project's dependencies, on this checkout's code.

Standard library only: it runs before anything else is imported.  A benchmark script
calls ``ensure_project_python()`` first.  It puts this checkout first on ``sys.path`` (so
``dynamo_trio`` is this worktree's, whatever an editable install points at), and when the
running interpreter lacks the project's dependencies (``python3 benchmarks/x.py`` with a
bare system Python), it re-executes the script under the checkout's own environment:
``.venv/bin/python``, else a nox session's (``.nox/tests-3-11/bin/python``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEEDED = ("trio", "h11", "hypercorn", "quart_trio", "prometheus_client", "msgspec", "httpx")
_MARK = "_DYNAMO_TRIO_BENCH_REEXEC"


def ensure_project_python(needed: tuple[str, ...] = NEEDED) -> None:
    """Return if this interpreter can run the benchmark; else re-exec it under one that can."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get(_MARK):
        sys.exit(f"{sys.executable} still lacks {', '.join(missing)}")
    candidates = [REPO / ".venv/bin/python", REPO / ".nox/tests-3-11/bin/python"]
    candidates += sorted(REPO.glob(".nox/*/bin/python"))
    for candidate in candidates:
        if candidate.exists():
            print(
                f"({sys.executable} lacks {', '.join(missing)}: running under {candidate})",
                file=sys.stderr,
                flush=True,
            )
            os.environ[_MARK] = "1"
            os.execv(candidate, [str(candidate), *sys.argv])
    sys.exit(
        f"{sys.executable} lacks {', '.join(missing)} and this checkout has no environment: "
        "create one with `python3 -m nox -s tests -- --collect-only -q` (or "
        "`python3 -m venv .venv && .venv/bin/pip install -e . h11`), or run the script with "
        "a Python that has dynamo-trio's dependencies"
    )
