"""What a hosted engine is doing, on the worker's ``/metrics`` (dynamo-trio names).

``dynamo_engine_requests_running{model}``: requests inside the engine now (a
thread generating, for transformers), the gauge to watch go to 0 after a
hang-up, as vLLM's ``vllm:num_requests_running``.
``dynamo_engine_generated_tokens_total{model}``: tokens the model produced,
read or not: what a hang-up costs beyond the last token sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

ENGINE_REQUESTS_RUNNING: Final = "dynamo_engine_requests_running"
ENGINE_GENERATED_TOKENS_TOTAL: Final = "dynamo_engine_generated_tokens_total"


@final
class EngineMetrics:
    """The engine's two series for one model; safe to update from any thread."""

    __slots__ = ("generated_tokens", "requests_running")

    def __init__(self, registry: CollectorRegistry | None, model: str) -> None:
        running = Gauge(
            ENGINE_REQUESTS_RUNNING,
            "Requests inside the engine now.",
            ["model"],
            registry=registry,
        )
        tokens = Counter(
            ENGINE_GENERATED_TOKENS_TOTAL,
            "Tokens the engine generated, whether or not they were sent.",
            ["model"],
            registry=registry,
        )
        self.requests_running: Final = running.labels(model=model)
        self.generated_tokens: Final = tokens.labels(model=model)
