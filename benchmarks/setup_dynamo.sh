#!/usr/bin/env bash
# Install NVIDIA Dynamo 1.6.1 beside dynamo-trio, for the side-by-side benchmarks.
#
#   bash benchmarks/setup_dynamo.sh [VENV]
#
# VENV defaults to $DYN_BENCH_DYNAMO_VENV, else ~/.cache/dynamo-trio-bench/dynamo-1.6.1:
# outside the repository, so nothing of Dynamo's is ever imported by dynamo-trio's tests.
# Idempotent: a complete venv is left as it is (delete it, or pass --force, to rebuild).
#
# What it installs, and why only that:
#   ai-dynamo-runtime==1.6.1   the Rust runtime wheel (the Python bindings, _core);
#                              its own dependencies: pydantic, uvloop
#   ai-dynamo==1.6.1 --no-deps the Python components (python -m dynamo.frontend); its full
#                              dependency list (transformers, kubernetes, aiohttp, redis,
#                              aisimulate, ...) is for the engines and the planner, and the
#                              frontend and a Python worker import none of it
#   packaging pyyaml msgspec   what `python -m dynamo.frontend` imports at startup
#   uvloop                     the event loop Dynamo's workers run on
#   tokenizers                 only to write the tiny model below (word-level, built in code)
# A local wheel of ai-dynamo-runtime is used when one is found in $DYN_BENCH_WHEELS
# (default /tmp/dyn), saving a 30 MB download.
#
# Then it writes a tiny model directory (VENV/tiny-model: config.json, tokenizer.json,
# tokenizer_config.json with a chat template, generation_config.json) with
# benchmarks/_tiny_model.py, and checks that the frontend and a worker import offline.
set -euo pipefail

force=0
if [[ "${1:-}" == "--force" ]]; then
    force=1
    shift
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=1.6.1
venv="${1:-${DYN_BENCH_DYNAMO_VENV:-$HOME/.cache/dynamo-trio-bench/dynamo-$version}}"
wheels="${DYN_BENCH_WHEELS:-/tmp/dyn}"
python="${PYTHON:-python3}"
ready="$venv/.dynamo-trio-bench-ready"

if [[ -f "$ready" && $force -eq 0 ]]; then
    echo "Dynamo $version is ready in $venv (--force rebuilds it)"
    exit 0
fi
rm -f "$ready"

if ! "$python" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] < (3, 14))'; then
    echo "Dynamo $version needs Python 3.10-3.13; set PYTHON=... (found $("$python" -V))" >&2
    exit 1
fi
if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)

runtime="ai-dynamo-runtime==$version"
shopt -s nullglob
local_wheels=("$wheels"/ai_dynamo_runtime-"$version"-*.whl)
shopt -u nullglob
if [[ ${#local_wheels[@]} -gt 0 ]]; then
    runtime="${local_wheels[0]}"
fi
echo "installing $runtime"
"${pip[@]}" install "$runtime"
echo "installing ai-dynamo==$version --no-deps, and what its frontend imports"
echo "(pip then lists ai-dynamo's unmet requirements: expected, none of them is used here)"
"${pip[@]}" install --no-deps "ai-dynamo==$version"
"${pip[@]}" install packaging pyyaml msgspec uvloop tokenizers

echo "writing the tiny model"
"$venv/bin/python" "$here/_tiny_model.py" "$venv/tiny-model"

echo "checking that the frontend and a worker import"
(
    cd "$venv"  # not the repository: nothing of it on sys.path
    HF_HUB_OFFLINE=1 "$venv/bin/python" -m dynamo.frontend --help >/dev/null
    "$venv/bin/python" -c '
import uvloop
from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime
'
)
"$venv/bin/python" -c 'import importlib.metadata as m; print("ai-dynamo", m.version("ai-dynamo"), "/ ai-dynamo-runtime", m.version("ai-dynamo-runtime"))'
touch "$ready"
echo "Dynamo $version is ready in $venv"
