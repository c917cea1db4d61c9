"""A worker written against Dynamo 1.6.1's Python API (``ai-dynamo-runtime==1.6.1``).

It serves ``porting.backend.generate``: ``{"n": N, "delay": s}`` yields N items,
each saying what the handler's context held (request id, trace, metadata); a
stop ends it the way Dynamo's examples do, by raising ``asyncio.CancelledError``.
"""

import asyncio
import logging

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_worker
from dynamo.runtime.logging import configure_dynamo_logging

configure_dynamo_logging(service_name="backend")
logger = logging.getLogger("porting.worker")


class Backend:
    async def generate(self, request, context):
        tenant = context.metadata.get("tenant")
        logger.info("generating %d items for tenant %s", request["n"], tenant)
        for i in range(request["n"]):
            if context.is_stopped():
                logger.info("stopped after %d items", i)
                raise asyncio.CancelledError
            await asyncio.sleep(request.get("delay", 0))
            yield {
                "i": i,
                "request_id": context.id(),
                "trace_id": context.trace_id,
                "span_id": context.span_id,
                "parent_span_id": context.parent_span_id,
                "tenant": tenant,
            }


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    endpoint = runtime.endpoint("porting.backend.generate")
    print(f"worker {endpoint.connection_id():x} serving", flush=True)
    await endpoint.serve_endpoint(
        Backend().generate,
        graceful_shutdown=True,
        metrics_labels=[("model", "echo")],
    )


if __name__ == "__main__":
    uvloop.run(worker())
