"""A worker and a client written against Dynamo 1.6.1's API, run with only their imports
changed.

``porting/dynamo_1_6_1/`` holds the programs as written for Dynamo 1.6.1 (they
were run against its wheel: see ``porting/README.md``); ``porting/dynamo_trio_port/``
the ported ones.  The first test pins what "only the imports changed" means: every
line that differs is an import, the entry point, or an asyncio call with a trio
twin (the table in the README and in docs/porting.md), and nothing else, so every
line that uses Dynamo's API runs as written.  The second runs the port as two
processes and checks what the programs print, what the worker logs and counts.
"""

from __future__ import annotations

import ast
import difflib
import re
import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._metrics import samples as scrape

from .conftest import ROOT
from .test_examples import wait_for_line

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from .conftest import Proc

PORTING = ROOT / "tests" / "e2e" / "porting"
ORIGINAL = PORTING / "dynamo_1_6_1"
PORTED = PORTING / "dynamo_trio_port"

ENTRY_POINT = re.compile(r"(?P<indent>\s*)(?:asyncio|uvloop)\.run\((?P<main>\w+)\(\)\)")
# Module renames of the port; every other import stays as it is.
MODULES = {
    "dynamo.runtime": "dynamo_trio",
    "dynamo.runtime.logging": "dynamo_trio",
    "uvloop": "trio",
}


def imports(path: Path) -> tuple[set[tuple[str, str | None]], set[int]]:
    """What a program imports, as (module, name) pairs, and the lines its imports take."""
    names: set[tuple[str, str | None]] = set()
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.module is not None and node.level == 0
            names.update((node.module, alias.name) for alias in node.names)
        else:
            continue
        assert node.end_lineno is not None
        lines.update(range(node.lineno, node.end_lineno + 1))
    return names, lines


def body(path: Path, import_lines: set[int]) -> list[str]:
    """The program without its imports and blank lines (isort groups imports its own way)."""
    return [
        text
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if text.strip() and number not in import_lines
    ]


def classify(old: str, new: str) -> str | None:
    """Which documented porting step turns the line ``old`` into ``new``, if any."""
    entry = ENTRY_POINT.fullmatch(old)
    if entry and new == f"{entry['indent']}trio.run({entry['main']})":
        return "entry point"
    if "asyncio.sleep(" in old and new == old.replace("asyncio.sleep(", "trio.sleep("):
        return "asyncio call"
    return None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("worker.py", {"name imported anew": 4, "entry point": 1, "asyncio call": 1}),
        ("client.py", {"name imported anew": 4, "entry point": 1}),
    ],
)
def test_only_imports_the_entry_point_and_asyncio_calls_change(
    name: str, expected: dict[str, int]
) -> None:
    original, ported = ORIGINAL / name, PORTED / name
    old_imports, old_import_lines = imports(original)
    new_imports, new_import_lines = imports(ported)
    # The imports: the same names, from the renamed modules.
    renamed = {(MODULES.get(module, module), name) for module, name in old_imports}
    assert renamed == new_imports
    counts = {"name imported anew": sum(module in MODULES for module, _ in old_imports)}
    # Everything else: line for line, each change a documented step.
    old_body, new_body = body(original, old_import_lines), body(ported, new_import_lines)
    matcher = difflib.SequenceMatcher(a=old_body, b=new_body, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        # Lines are replaced one for one: nothing added, nothing taken away.
        assert tag == "replace" and i2 - i1 == j2 - j1, (tag, old_body[i1:i2], new_body[j1:j2])
        for old, new in zip(old_body[i1:i2], new_body[j1:j2], strict=True):
            kind = classify(old, new)
            assert kind is not None, f"{name}: {old!r} -> {new!r} is not a documented porting step"
            counts[kind] = counts.get(kind, 0) + 1
    assert counts == expected
    # Nothing of Dynamo's is left to import, and the original really was a Dynamo program.
    assert not any(module.startswith("dynamo.") for module, _ in new_imports)
    assert ("dynamo.runtime", "dynamo_worker") in old_imports


async def status_url(proc: Proc) -> str:
    with trio.fail_after(10):
        while "status server listening on" not in proc.stderr.decode(errors="replace"):  # noqa: ASYNC110 - a pipe
            await trio.sleep(0.02)
    line = next(
        line
        for line in proc.stderr.decode(errors="replace").splitlines()
        if "status server listening on" in line
    )
    return line.rsplit(" ", 1)[1]


@pytest.mark.slow
async def test_the_ported_worker_and_client_run(
    spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    worker = await spawn(str(PORTED / "worker.py"), env=env, name="worker")
    await wait_for_line(worker, "serving")
    worker_id = worker.stdout_lines[0].split()[1]
    client = await spawn(str(PORTED / "client.py"), env={**env, "DYN_SYSTEM_PORT": "-1"})
    assert await client.wait_exit(within=20) == 0, client.stderr.decode(errors="replace")
    calls = {event["call"]: event for event in client.events}

    generate = calls["generate"]
    [trace_id] = {item["trace_id"] for item in generate["items"]}
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id)
    for i, item in enumerate(generate["items"]):
        assert item["i"] == i and item["request_id"] == generate["request_id"]
        assert item["tenant"] == "acme"  # Context(metadata=...) reached the handler
        # The client's Context() had no trace: the worker's context begins one.
        assert item["parent_span_id"] is None and re.fullmatch(r"[0-9a-f]{16}", item["span_id"])
    assert len(generate["items"]) == 3
    # annotated=False: plain data, no Annotated objects (json.dumps would have failed).
    assert [item["i"] for item in calls["round_robin"]["items"]] == [0, 1]
    assert [item["i"] for item in calls["random"]["items"]] == [0, 1]
    assert [item["i"] for item in calls["direct"]["items"]] == [0]
    assert f"{calls['direct']['instance_id']:x}" == worker_id
    stopped = calls["stopped"]
    assert (stopped["received"], stopped["stopped"]) == (2, True)

    # The worker's log lines for each request name it and its trace.
    log = worker.stderr.decode(errors="replace")
    tag = f"porting.worker [request_id={generate['request_id']} trace_id={trace_id}]"
    assert f"{tag}: [backend] generating 3 items for tenant acme" in log
    assert re.search(
        rf"porting\.worker \[request_id={stopped['request_id']} trace_id=[0-9a-f]{{32}}\]: "
        r"\[backend\] stopped after \d+ items",
        log,
    ), log

    # metrics_labels and worker_id label the worker's series, as in Dynamo.
    labels = {
        "dynamo_namespace": "porting",
        "dynamo_component": "backend",
        "dynamo_endpoint": "generate",
        "worker_id": worker_id,
        "model": "echo",
    }
    url = await status_url(worker)
    with trio.fail_after(5):
        while True:
            samples = {
                name: value
                for name, found, value in await scrape(url)
                if name.startswith("dynamo_component_") and found == labels
            }
            if samples.get("dynamo_component_inflight_requests") == 0:
                break
            await trio.sleep(0.05)
    assert samples["dynamo_component_requests_total"] == 5
    assert samples["dynamo_component_cancellation_total"] == 1

    worker.signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0
    assert "Traceback" not in log
