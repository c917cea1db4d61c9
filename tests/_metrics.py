"""The one Prometheus scraper of the tests: the samples a ``/metrics`` endpoint serves."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


async def samples(url: str, name: str | None = None) -> list[tuple[str, dict[str, str], float]]:
    """Every sample on ``url``'s ``/metrics`` (only those named ``name``, if given):
    its name, labels and value, in the order served."""
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{url}/metrics")
    assert response.status_code == 200, response.text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if name is None or sample.name == name
    ]


async def scrape(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (matching ``labels``) on ``url``'s ``/metrics``."""
    return sum(
        value
        for _, found, value in await samples(url, name)
        if all(found.get(k) == v for k, v in labels.items())
    )


async def scrape_all(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` on ``url``'s ``/metrics``, with its labels (for messages)."""
    return [(labels, value) for _, labels, value in await samples(url, name)]
