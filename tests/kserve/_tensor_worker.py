"""A tensor-model worker for the KServe tests: the mocker's ``mock-tensor``, reporting.

Run as ``python tests/kserve/_tensor_worker.py``.  Serves ``mock-tensor``
(``OUTPUT0 = INPUT0``, parameters ``delay_ms`` and ``repeat``) on
``dynamo/tensor/infer``; its handler reports ``start`` and ``exit`` (with the
context's final state and reason, and how the generator ended) as JSON lines
on stdout, as the frontend tests' model worker does.
"""

from __future__ import annotations

import trio

from dynamo_trio.mocker._tensor import echo_tensor, tensor_model_config
from dynamo_trio.runtime import DistributedRuntime, dynamo_worker
from tests.e2e._model_worker import report, reporting

MODEL = "mock-tensor"


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    endpoint = runtime.namespace("dynamo").component("tensor").endpoint("infer")
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve_endpoint, reporting(MODEL, echo_tensor))
        await endpoint.register_model(
            MODEL, "tensor", tensor_model_config=tensor_model_config(MODEL)
        )
        report("ready", status_url=runtime.status_url, instance_id=runtime.instance_id)


if __name__ == "__main__":
    trio.run(main)
