"""A media request whose worker is lost: before its first item it goes to another
instance, as any request does; after it, there is no continuation for media, so the
body ends with its failure (MJPEG: an error part, no closing boundary), whatever
``--migration-limit`` says, and nobody counts it as a client's hang-up.

The workers are processes (either may be the one killed); the frontend serves in the
test's process.
"""

from __future__ import annotations

import base64
import json
import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests._memhttp import http_client
from tests.e2e.conftest import scrape

from ._faults import frontend_here, migrations, serving, start_workers
from .test_media import parts_of

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from tests._serving import Cluster

pytestmark = pytest.mark.slow


async def test_an_image_whose_worker_dies_during_its_steps_is_made_by_another(
    spawn: Callable[..., Any], env: dict[str, str], here: Cluster
) -> None:
    workers = await start_workers(spawn, env, "worker 0", "worker 1")
    url = await frontend_here(here)
    body = {
        "model": "mock-image",
        "prompt": "p",
        "size": "8x8",
        "response_format": "b64_json",
        "nvext": {"num_inference_steps": 50},
    }
    async with (
        http_client(url, timeout=30) as http,
        trio.open_nursery() as nursery,
    ):
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(
                await http.post(
                    "/v1/images/generations", json=body, headers={"x-request-id": "moved"}
                )
            )

        nursery.start_soon(ask)
        first = await serving(workers, "moved")
        first.signal(signal.SIGKILL)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    png = base64.b64decode(answer.json()["data"][0]["b64_json"])
    assert png.startswith(b"\x89PNG")
    [other] = [worker for worker in workers if worker is not first]
    exit_event = await other.wait_for("exit", id="moved")
    assert exit_event["how"] == "returned"
    assert await migrations(url, migration_type="new_request") == 1
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0


async def test_a_partly_streamed_video_whose_worker_dies_ends_with_an_error_part(
    spawn: Callable[..., Any], env: dict[str, str], here: Cluster
) -> None:
    workers = await start_workers(spawn, env, "worker 0", "worker 1")
    url = await frontend_here(here, "--migration-limit", "3")
    body = {"model": "mock-video", "prompt": "p", "size": "8x8", "nvext": {"num_frames": 5000}}
    received = b""
    async with http_client(url, timeout=30) as http:
        headers = {"x-request-id": "cut"}
        async with http.stream("POST", "/v1/videos/stream", json=body, headers=headers) as response:
            assert response.status_code == 200
            killed = False
            async for chunk in response.aiter_bytes():
                received += chunk
                if not killed and received.count(b"--frame\r\n") >= 3:
                    (await serving(workers, "cut")).signal(signal.SIGKILL)
                    killed = True
    assert not received.endswith(b"--frame--\r\n"), "cut short, never read as complete"
    *frames, (kind, error) = parts_of(received)
    assert len(frames) >= 3 and {frame_kind for frame_kind, _ in frames} == {"image/jpeg"}
    assert kind == "application/json"
    assert json.loads(error)["error"]["type"] == "service_unavailable"
    assert await migrations(url) == 0, "media has no continuation: it never moves mid-stream"
    assert await scrape(url, "dynamo_frontend_model_cancellation_total") == 0
    starts = [e for w in workers for e in w.events if e["event"] == "start" and e["id"] == "cut"]
    assert len(starts) == 1
