"""Shared fixtures and assertions of the API tests: one real 3-node cluster per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.cluster.base import errors

from .harness import Cluster, log_tails, wait_until

ERROR_FIELDS = {"code", "message", "retriable", "definite"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test shows the last lines of its clusters' node logs (``harness.log_tails``)."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.when == "call" and (tails := log_tails()):
        report.sections.append(("node logs, last lines", tails))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A started 3-node cluster (3 queue groups) shared by the tests of one module.

    Tests using it must not kill nodes; they create their own topics (names unique per test).
    """
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(tmp, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        yield c
        for nid in c.nodes:
            assert c.alive(nid), f"{nid} died during the module:\n{c.log(nid)[-3000:]}"


def assert_error(r: requests.Response, status: int, code: str) -> dict[str, Any]:
    """``r`` is the catalogued error ``code`` with HTTP ``status`` and the stable body shape."""
    assert r.status_code == status, f"{r.status_code} (wanted {status}): {r.text[:500]}"
    body = r.json()
    assert_error_shape(body, status)
    e: dict[str, Any] = body["error"]
    assert e["code"] == code, e
    known = errors.BY_CODE[code]
    assert (e["retriable"], e["definite"]) == (known.retriable, known.definite), e
    return e


def assert_error_shape(body: Any, status: int) -> None:
    """``{"error": {"code", "message", "retriable", "definite", ...}}`` with a catalogued code
    whose HTTP status is ``status``."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    e = body["error"]
    assert isinstance(e, dict) and set(e) >= ERROR_FIELDS, e
    assert e["code"] in errors.BY_CODE, e
    assert isinstance(e["message"], str) and e["message"], e
    assert isinstance(e["retriable"], bool) and isinstance(e["definite"], bool), e
    assert errors.BY_CODE[e["code"]].status == status, (status, e)


def describe(c: Cluster, topic: str, node: str | None = None) -> dict[str, Any]:
    r = c.get(f"/v1/topics/{topic}", node)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def high_offsets(c: Cluster, topic: str, node: str | None = None) -> list[int]:
    return [q["high_offset"] for q in describe(c, topic, node)["queues"]]


def fetch(c: Cluster, topic: str, queue: int, node: str | None = None, **params: Any) -> requests.Response:
    return c.get(f"/v1/topics/{topic}/queues/{queue}/messages", node, params=params)


def wait_applied_everywhere(c: Cluster, topic: str) -> None:
    """Every replica of every queue group of ``topic`` has applied the same state."""
    for g in sorted(set(describe(c, topic)["queue_groups"])):
        c.wait_replicas_equal(str(g))


def wait_topic_gone(c: Cluster, topic: str, node: str) -> None:
    wait_until(
        lambda: c.get(f"/v1/topics/{topic}", node).status_code == 404,
        10,
        what=f"{topic} gone on {node}",
    )
