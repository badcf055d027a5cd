"""Read a Prometheus ``/metrics`` page the way a Prometheus server does (its own parser)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample on the page: name -> [(labels, value)]. Fails on a non-200 or bad text."""
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain"), answer.headers
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def value(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for got, v in samples.get(name, []) if labels.items() <= got.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]
