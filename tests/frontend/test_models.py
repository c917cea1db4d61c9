"""``/v1/models`` follows discovery: models come with their worker and go with it (SPEC §5-§6).

A worker that shuts down deregisters at once; one that is SIGKILLed vanishes
when its lease expires (``DYN_LEASE_TTL_SECS``, 1.5 s in the harness).  In
between, its model cards still exist while its instance is unreachable: the
frontend answers 503 then, and 404 once the cards are gone.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import openai
import pytest
from openai.types import Model

from tests._memhttp import http_client
from tests.e2e.conftest import MODEL_WORKER

from .conftest import CHAT_BODY, MODELS, assert_openai_error, listed_models, wait_for_models

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.e2e.conftest import Stack

    from .conftest import StartProcStack, StartStack

pytestmark = pytest.mark.slow

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "mock": ("/v1/chat/completions", {**CHAT_BODY, "max_tokens": 1}),
    "prefill": ("/v1/completions", {"model": "prefill", "prompt": "hi"}),
    "mock-embed": ("/v1/embeddings", {"model": "mock-embed", "input": "hi"}),
    "slow-embed": ("/v1/embeddings", {"model": "slow-embed", "input": "hi"}),
}


async def assert_all_models_are_404(running: Stack) -> None:
    async with http_client(running.url) as http:
        for model, (path, body) in REQUESTS.items():
            response = await http.post(path, json=body)
            assert_openai_error(response, 404, "not_found_error", code="model_not_found")
            assert f"`{model}` does not exist" in response.text


async def test_models_lists_exactly_the_registered_models(stack: StartStack) -> None:
    running = await stack()
    async with http_client(running.url) as http:
        response = await http.get("/v1/models")
        health = (await http.get("/health")).json()
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "list"
    assert [model["id"] for model in body["data"]] == sorted(MODELS)
    for model in body["data"]:
        assert set(model) == {"id", "object", "created", "owned_by"}
        assert (model["object"], model["owned_by"]) == ("model", "dynamo-trio")
        assert abs(model["created"] - time.time()) < 60
    assert health["models"] == sorted(MODELS)
    # The openai client reads the list into its own types.
    client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="-", max_retries=0)
    async with client:
        listed = [model async for model in client.models.list()]
    assert all(isinstance(model, Model) for model in listed)
    assert [model.id for model in listed] == sorted(MODELS)


async def test_models_vanish_promptly_when_the_worker_shuts_down(
    proc_stack: StartProcStack, spawn: Callable[..., Any], env: dict[str, str]
) -> None:
    # A lease no test outlasts: the models can vanish only by the worker deregistering.
    env["DYN_LEASE_TTL_SECS"] = "600"
    running = await proc_stack()
    running.worker.signal(signal.SIGTERM)
    await wait_for_models(running.url, set(), within=30)
    assert await running.worker.wait_exit() == 0
    await assert_all_models_are_404(running)
    # A new worker brings them back.
    worker = await spawn(str(MODEL_WORKER), env=env, name="second model worker")
    await wait_for_models(running.url, MODELS, within=10)
    async with http_client(running.url) as http:
        path, body = REQUESTS["mock"]
        response = await http.post(path, json=body, headers={"x-request-id": "after"})
    assert response.status_code == 200, response.text
    await worker.wait_for("start", id="after")


async def test_a_killed_workers_models_are_503_until_its_lease_expires_then_404(
    proc_stack: StartProcStack, env: dict[str, str]
) -> None:
    # A lease long enough for the checks below on a busy machine; the models stay
    # listed until it expires (asserted after the checks), then vanish.
    ttl = 4.0
    env["DYN_LEASE_TTL_SECS"] = str(ttl)
    running = await proc_stack()
    async with http_client(running.url) as http:
        path, body = REQUESTS["mock"]
        assert (await http.post(path, json=body)).status_code == 200
        running.worker.signal(signal.SIGKILL)
        assert await running.worker.wait_exit() == -signal.SIGKILL
        # The cards outlive the process until the lease expires (at least ttl/3 more)...
        assert await listed_models(running.url) == MODELS
        # ...and meanwhile the instance they name cannot be reached: 503, not a hang or a 500.
        for model, (path, body) in REQUESTS.items():
            response = await http.post(path, json=body)
            error = assert_openai_error(
                response, 503, "service_unavailable", code="service_unavailable"
            )
            # Either the frontend already knows the instance is down, or finds out now.
            message = error["message"]
            assert f"model `{model}`" in message or "cannot connect to" in message, error
            assert "no live instance serves the" in message or "cannot connect to" in message
        # Still inside the lease: the 503s above were not the cards' expiry.
        assert await listed_models(running.url) == MODELS
    await wait_for_models(running.url, set(), within=ttl * 4)
    await assert_all_models_are_404(running)
