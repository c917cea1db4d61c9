"""Large buffers (request bodies, big frames) go back to the system when freed."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import gc, sys
from dynamo_trio._gc import give_back_large_buffers

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

give_back_large_buffers()
before = rss_kib()
kept = []
for _ in range(6):
    body = bytearray()
    for _ in range(256):
        body += b"x" * 65536  # a 16 MiB body, arriving in 64 KiB pieces
    data = bytes(body)
    del body
    kept.append(b"y" * 1000)  # something small allocated meanwhile, and kept
    del data
    gc.collect()
print(rss_kib() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_bodies_are_given_back() -> None:
    grown = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout
    assert int(grown) < 4 * 1024, grown  # KiB: not the tens of MiB a heap would keep
