"""The public surface of dynamo_trio.engines is exactly its __all__, and it needs no engine."""

from __future__ import annotations

import subprocess
import sys

import dynamo_trio.engines


def test_all_names_the_public_surface() -> None:
    public = {name for name in vars(dynamo_trio.engines) if not name.startswith("_")}
    assert set(dynamo_trio.engines.__all__) == public


def test_importing_the_package_loads_no_engine_library() -> None:
    code = (
        "import sys, dynamo_trio.engines, dynamo_trio.cli; "
        "print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
