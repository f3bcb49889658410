"""The visibility timeout alone brings an unacked message back (issue 21, item 3): with the
default backoff (10 s first), a message received with a 2 s visibility timeout is received again
about 2 s later, not 12 s; a nack still waits the backoff."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster

pytestmark = pytest.mark.timeout(120)

SUB = "/v1/topics/jobs/subscriptions/g"


def receive(c: Cluster, **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"{SUB}/receive", {"wait_ms": 0, **body})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def test_an_unacked_message_comes_back_when_its_visibility_timeout_ends_not_after_the_backoff(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, nodes=3) as c:  # the default [delivery]: backoff 10 s, 30 s, ...
        c.start()
        c.wait_ready()
        c.create_topic("jobs", queues=1)
        assert c.produce("jobs", [{"value": "a"}, {"value": "b"}]).status_code == 200
        first, second = receive(c, max=2, visibility_ms=2000)
        received_at = time.monotonic()
        # a: left to expire. It is back once its 2 s pass (and the next tick), long before 10 s.
        # After the backoff it could not be back before 12 s: under 9 s leaves a loaded machine
        # room (a 5 s bound left it 3 s) and still tells the two apart.
        (again,) = receive(c, max=1, visibility_ms=30_000, wait_ms=8000)
        elapsed = time.monotonic() - received_at
        assert (again["offset"], again["attempt"]) == (first["offset"], 2)
        assert 1.9 <= elapsed < 9.0, elapsed
        # b: expired too by now; nacked on its second delivery, it waits the backoff (10 s).
        (b,) = receive(c, max=1, visibility_ms=30_000, wait_ms=8000)
        assert (b["offset"], b["attempt"]) == (second["offset"], 2)
        r = c.post(f"{SUB}/nack", {"receipts": [b["receipt"]]})
        assert r.status_code == 200 and r.json()["results"][0]["ok"], r.text
        assert receive(c, max=1, wait_ms=5000) == []  # the backoff of attempt 2: 30 s
