"""Reading GET /metrics in tests: every sample through Prometheus's own text parser
(prometheus_client.parser), looked up by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Sidecar

TOKEN = "metrics-admin-token-0123"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(sc: Sidecar, token: str = TOKEN) -> Samples:
    """Every sample as {(name, sorted labels): value}; fails on a line the parser refuses."""
    code, body = sc.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert code == 200, body
    assert isinstance(body, bytes)
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]
