"""The default file store, damaged while a frontend and a worker use it (real processes).

A worker owns its registrations: entries deleted from the store come back
within the lease TTL, and the model with them.  Whatever else lands in the
directory (FIFOs, garbage by the thousand) neither blocks the frontend nor
floods its log, and it still shuts down on SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from dynamo_trio.discovery._file_store import FileLayout, key_to_name
from tests._memhttp import http_client

from .conftest import CHAT_BODY, MODELS, wait_for_models

if TYPE_CHECKING:
    from .conftest import StartProcStack

pytestmark = pytest.mark.slow

GARBAGE = 2000


def skip_lines(stderr: bytearray) -> list[str]:
    return [line for line in stderr.decode(errors="replace").splitlines() if "skipping" in line]


async def test_a_damaged_store_heals_and_never_blocks_the_frontend(
    proc_stack: StartProcStack, env: dict[str, str]
) -> None:
    ttl = float(env["DYN_LEASE_TTL_SECS"])
    layout = FileLayout(Path(env["DYN_FILE_KV"]))
    layout.ensure()
    # Before anything starts: FIFOs where entries and leases are read, and garbage.
    os.mkfifo(layout.kv_dir / key_to_name("v1/models/dynamo/fifo/chat/1"))
    os.mkfifo(layout.lease_dir / f"{0xF1F0:016x}.lease")
    for i in range(GARBAGE):
        path = layout.kv_dir / key_to_name(f"v1/models/dynamo/junk-{i}/chat/1")
        path.write_bytes(b"\xff not an entry")
    running = await proc_stack()

    # The worker's registrations are deleted from the store behind its back.
    ours = [
        path
        for path in layout.kv_dir.iterdir()
        if path.name.startswith((key_to_name("v1/models/"), key_to_name("v1/instances/")))
        and not path.name.startswith(key_to_name("v1/models/dynamo/junk-"))
        and path.is_file()
    ]
    assert len(ours) >= 4 + 6, [path.name for path in ours]  # 4 instances, 6 model cards
    names = {path.name for path in ours}
    for path in ours:
        path.unlink()
    # The worker writes every one of them back (it checks every TTL/3; the bound is only
    # a timeout, generous for a loaded machine)...
    with trio.fail_after(ttl * 10):
        while not names <= {path.name for path in layout.kv_dir.iterdir()}:  # noqa: ASYNC110
            await trio.sleep(0.01)
    await wait_for_models(running.url, MODELS, within=10)  # ...and the frontend follows
    async with http_client(running.url) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT_BODY, "max_tokens": 2})
    assert response.status_code == 200, response.text

    # Each bad file was reported once by each process (its readers share one scanner),
    # not once per poll; the bad lease file apart from the flood of bad entries.
    before = skip_lines(running.frontend.stderr)
    assert any("a FIFO" in line for line in before), before
    summaries = [int(m[1]) for line in before if (m := re.search(r"(\d+) more unusable", line))]
    assert summaries, before
    assert max(summaries) >= GARBAGE - 10, summaries  # the rest of the flood: one line
    assert len(before) < 100, before
    # One more bad file: once the frontend reports it, it has polled again since
    # ``before``; and that poll reported nothing it had reported already.
    late = key_to_name("v1/models/dynamo/late-junk/chat/1")
    (layout.kv_dir / late).write_bytes(b"\xff not an entry")
    with trio.fail_after(10):
        while not any(late in line for line in skip_lines(running.frontend.stderr)):
            await running.frontend.changed()
    after = skip_lines(running.frontend.stderr)
    assert after[: len(before)] == before
    assert len(after) == len(before) + 1 and late in after[-1], after[len(before) :]

    running.frontend.signal(signal.SIGTERM)
    assert await running.frontend.wait_exit(within=10) == 0
    running.worker.signal(signal.SIGTERM)
    assert await running.worker.wait_exit(within=10) == 0
