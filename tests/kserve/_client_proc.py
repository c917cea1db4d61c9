"""A Triton gRPC client process that starts a long infer and waits (the test kills it).

Run as ``python tests/kserve/_client_proc.py HOST:PORT``; prints ``{"event": "sent"}``
once the call is under way.
"""

from __future__ import annotations

import json
import sys
import threading

import tritonclient.grpc as grpcclient

from tests.kserve._client import tensor

if __name__ == "__main__":
    client = grpcclient.InferenceServerClient(sys.argv[1])
    client.async_infer(
        "mock-tensor",
        [tensor([1, 2, 3])],
        callback=lambda result, error: None,
        parameters={"delay_ms": 3_600_000},
    )
    print(json.dumps({"event": "sent"}), flush=True)
    threading.Event().wait()
