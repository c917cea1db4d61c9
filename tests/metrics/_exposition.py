"""Read metric values back out of a registry's Prometheus text exposition.

The tests read what a scraper would read (``generate_latest`` parsed by
``prometheus_client.parser``), not the client's internal state, so they check
the names, label sets and types that reach Prometheus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.samples import Sample


class Scrape:
    """One parsed exposition: samples by name, and the declared type of each family."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: list[Sample] = []
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            self.samples.extend(family.samples)

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Scrape:
        return cls(generate_latest(registry).decode())

    def value(self, name: str, **labels: str) -> float | None:
        """The sample with exactly this name and label set, or ``None`` if it is absent."""
        for sample in self.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
        return None

    def series(self, name: str) -> list[dict[str, str]]:
        """The label sets of every sample with this name."""
        return [sample.labels for sample in self.samples if sample.name == name]


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
