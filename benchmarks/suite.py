"""The test suite's own figures: wall time, and how much of it starts real processes.

Run: ``python3 benchmarks/suite.py [--coverage] [-- PYTEST ARGS]`` (default ``-n 4
--dist worksteal tests``).  It runs the suite once with ``_spawn_record.py``, which notes
every test that starts a process (fixtures included), and prints:

- the wall time and pytest's summary line;
- **real-process share**: the lines of the test functions that started a process (or
  used a fixture that did), over all lines under ``tests/``; and the same with the
  process harnesses added (helper modules under ``tests/`` that start processes);
- with ``--coverage``, branch coverage of ``dynamo_trio`` (subprocesses included).

Skipped tests start nothing: run it under an environment with the engines (the
``engines-vllm`` nox environment) to count the engine tests too.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bootstrap import REPO, ensure_project_python

STARTS = re.compile(r"\b(open_process|run_process|subprocess\.|Popen|os\.fork)\b")


def test_functions(path: Path) -> dict[str, int]:
    """Each test function's name -> its length in lines."""
    lengths: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
            and node.end_lineno is not None
        ):
            lengths[node.name] = node.end_lineno - node.lineno + 1
    return lengths


def spawning_tests(lines: list[str]) -> set[str]:
    """The node ids of the tests that started a process, or used a fixture that did."""
    tests = {line[5:] for line in lines if line.startswith("test ")}
    fixtures = {line[8:] for line in lines if line.startswith("fixture ")}
    for line in lines:
        if line.startswith("uses "):
            _, nodeid, *used = line.split(" ")
            if fixtures.intersection(used):
                tests.add(nodeid)
    return tests


def share(spawned: set[str]) -> None:
    files = sorted((REPO / "tests").rglob("*.py"))
    total = sum(len(path.read_text().splitlines()) for path in files)
    counted: set[tuple[str, str]] = set()
    real = 0
    for nodeid in spawned:
        path, _, rest = nodeid.partition("::")
        name = re.sub(r"\[.*", "", rest.rsplit("::", 1)[-1])
        if (path, name) not in counted:
            counted.add((path, name))
            real += test_functions(REPO / path).get(name, 0)
    harnesses = [
        path
        for path in files
        if not path.name.startswith("test_") and STARTS.search(path.read_text())
    ]
    harness = sum(len(path.read_text().splitlines()) for path in harnesses)
    print(f"test lines: {total:,}")
    print(
        f"real-process share: {len(counted)} test functions started a process, "
        f"{real:,} lines ({100 * real / total:.1f}%); with {len(harnesses)} harness modules "
        f"({harness:,} lines): {100 * (real + harness) / total:.1f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coverage", action="store_true")
    parser.add_argument("pytest_args", nargs="*", default=["-n", "4", "--dist", "worksteal"])
    args = parser.parse_args()
    pytest_args = list(args.pytest_args)
    if not any(not arg.startswith("-") and (REPO / arg).exists() for arg in pytest_args):
        pytest_args.append("tests")
    with tempfile.TemporaryDirectory(prefix="suite-") as scratch:
        log = Path(scratch, "spawned")
        env = {
            **os.environ,
            "DYN_BENCH_SPAWN_LOG": str(log),
            "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), str(REPO)]),
        }
        command = [sys.executable]
        if args.coverage:
            if importlib.util.find_spec("coverage") is None:
                sys.exit(f"--coverage needs coverage.py in {sys.executable}: pip install coverage")
            rc = Path(scratch, "coveragerc")
            rc.write_text(
                "[run]\nbranch = True\nparallel = True\npatch = subprocess\n"
                f"source = dynamo_trio\nconcurrency = thread\ndata_file = {scratch}/.coverage\n"
            )
            env["COVERAGE_RCFILE"] = str(rc)
            command += ["-m", "coverage", "run", "-m"]
        else:
            command += ["-m"]
        command += ["pytest", "-p", "_spawn_record", "-p", "no:cacheprovider", "-q"]
        started = time.perf_counter()
        result = subprocess.run(
            [*command, *pytest_args], cwd=REPO, env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - started
        summary = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
        print(f"wall time: {wall:.1f} s; pytest: {summary[0]} (exit {result.returncode})")
        share(spawning_tests(log.read_text().splitlines() if log.exists() else []))
        if args.coverage:
            coverage = [sys.executable, "-m", "coverage"]
            subprocess.run([*coverage, "combine", "-q"], cwd=REPO, env=env, check=True)
            report = subprocess.run(
                [*coverage, "report", "--format=total", "--precision=2"],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            print(f"branch coverage of dynamo_trio: {report.stdout.strip()}%")


if __name__ == "__main__":
    ensure_project_python()
    main()
