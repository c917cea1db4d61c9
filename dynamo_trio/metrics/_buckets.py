"""Histogram bucket bounds, in seconds.

Roughly log-spaced, chosen for what each histogram measures on an LLM server:
whole requests run from milliseconds (an embedding) to minutes (a long
generation), first tokens arrive within a few seconds unless a queue or a long
prefill is in the way, tokens follow each other within tens of milliseconds,
and a cancellation should take effect within a millisecond or two (anything
past a second means something ignored it).  ``prometheus_client`` adds the
``+Inf`` bucket itself.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CANCELLATION_LATENCY_BUCKETS",
    "INTER_TOKEN_LATENCY_BUCKETS",
    "REQUEST_DURATION_BUCKETS",
    "TIME_TO_FIRST_TOKEN_BUCKETS",
]

REQUEST_DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

TIME_TO_FIRST_TOKEN_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 480.0,
)  # fmt: skip

INTER_TOKEN_LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.0,
)  # fmt: skip

CANCELLATION_LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
)  # fmt: skip
