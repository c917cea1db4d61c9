"""The one Prometheus scraper of the tests: the samples an exposition holds, and their sums.

``/metrics`` is read over HTTP here (:func:`samples`: TCP, or :mod:`tests._memhttp`);
where a test reads it another way (from inside a network namespace, a registry
in the test's process) it parses the text with :func:`parse` and sums with :func:`total`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from tests._memhttp import http_client

if TYPE_CHECKING:
    from collections.abc import Iterable

Sample = tuple[str, dict[str, str], float]
"""One sample: its name, labels and value."""


def parse(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition, in the order served."""
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(
        value
        for found, found_labels, value in samples
        if found == name and all(found_labels.get(k) == v for k, v in labels.items())
    )


async def samples(url: str, name: str | None = None) -> list[Sample]:
    """Every sample on ``url``'s ``/metrics``, or every sample named ``name`` (the other
    lines left unparsed: parsing a whole exposition is most of what a scrape costs)."""
    async with http_client(url) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    if name is None:
        return parse(response.text)
    named = (line for line in response.text.splitlines() if _sample_name(line) == name)
    return parse("\n".join(named))


def _sample_name(line: str) -> str:
    """The sample name an exposition's line starts with (a comment's: ``#``)."""
    return line.partition("{")[0].partition(" ")[0]


async def scrape(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` (matching ``labels``) on ``url``'s ``/metrics``."""
    return total(await samples(url, name), name, **labels)


async def scrape_all(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` on ``url``'s ``/metrics``, with its labels (for messages)."""
    return [(labels, value) for _, labels, value in await samples(url, name)]
