"""The HTTP request series are labelled by method: a method a client makes up (aiohttp's pure-Python
parser takes any token) is counted as ``OTHER``, so random methods cannot grow the series (and the
middleware's cache of them) without bound."""

from __future__ import annotations

from types import SimpleNamespace

from raftmq.cluster.api.metrics import Metrics


def test_made_up_methods_are_counted_as_other_in_one_series() -> None:
    metrics = Metrics(SimpleNamespace())  # type: ignore[arg-type]
    for i in range(500):
        metrics.observe_request(f"M{i}", "unmatched", 404, 0.001)
    metrics.observe_request("GET", "/v1/topics", 200, 0.001)
    totals = {
        sample.labels["method"]: sample.value
        for family in metrics.requests.collect()
        for sample in family.samples
        if sample.name == "raftmq_http_requests_total"
    }
    assert totals == {"OTHER": 500.0, "GET": 1.0}
    assert len(metrics._request_children) == 2
