"""A leader crash with messages in flight loses none of them: the in-flight state is replicated, and
the new leader's tick redelivers them after their deadline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(180)

VISIBILITY_MS = 2000


def receive(c: Cluster, node: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post("/v1/topics/jobs/subscriptions/workers/receive", {"wait_ms": 0, **body}, node=node, timeout=40)
    if r.status_code != 200:  # an election in progress: retriable
        assert r.json()["error"]["retriable"], r.text
        return []
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def _all_finished(c: Cluster, node: str) -> bool:
    """Every message of the topic acked: the group's committed offset is each queue's end."""
    r = c.get("/v1/groups/workers/offsets", params={"topic": "jobs"}, node=node)
    return r.status_code == 200 and r.json()["offsets"] == {"0": 20, "1": 20, "2": 20}


def test_messages_in_flight_at_a_leader_crash_are_redelivered_and_none_is_lost(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3, extra_toml="[delivery]\ntick_ms = 100\n") as c:
        c.start()
        c.wait_ready()
        c.create_topic("jobs", queues=3)
        sent = {f"job-{i}" for i in range(60)}
        r = c.produce("jobs", [{"value": v, "queue": i % 3} for i, v in enumerate(sorted(sent))])
        assert r.status_code == 200, r.text

        # Take half of them into flight (never acked by this receiver: it "crashes" too).
        in_flight: list[dict[str, Any]] = []
        while len(in_flight) < 30:
            in_flight += receive(c, "n1", max=30 - len(in_flight), visibility_ms=VISIBILITY_MS, wait_ms=1000)
        assert {m["attempt"] for m in in_flight} == {1}
        victim = c.leader(str(c.get("/v1/topics/jobs").json()["queue_groups"][in_flight[0]["queue"]]))
        assert victim is not None
        c.kill(victim)
        survivors = [n for n in c.nodes if n != victim]

        # A new receiver gets everything: the rest at once, the in-flight ones after their deadline.
        # An ack crossed by an election may answer 503 unknown_outcome (retriable): its messages
        # were acked or come back after their deadline, so the loop goes on until it has them or
        # the group's committed offsets say every message is finished.
        acked: dict[str, int] = {}
        unsure: set[str] = set()  # acks of unknown outcome
        deadline = time.monotonic() + 60
        turn = 0
        while set(acked) != sent and time.monotonic() < deadline:
            if set(acked) | unsure == sent and _all_finished(c, survivors[0]):
                break
            node = survivors[turn % 2]
            turn += 1
            got = receive(c, node, max=20, wait_ms=1000, visibility_ms=VISIBILITY_MS)
            if not got:
                continue
            r = c.post(
                "/v1/topics/jobs/subscriptions/workers/ack",
                {"receipts": [m["receipt"] for m in got]},
                node=node,
            )
            if r.status_code != 200:
                assert r.status_code == 503 and r.json()["error"]["retriable"], r.text
                unsure |= {m["value"] for m in got}
                continue
            for m, result in zip(got, r.json()["results"], strict=True):
                if result.get("ok"):
                    acked[m["value"]] = m["attempt"]
        assert set(acked) | unsure == sent, f"lost: {sorted(sent - set(acked) - unsure)}"
        assert _all_finished(c, survivors[0]), "a message is still unacked"
        redelivered = {m["value"] for m in in_flight}
        assert redelivered <= set(acked) | unsure
        assert all(acked[v] >= 2 for v in redelivered & set(acked))  # delivered again, never lost

        # The crashed node comes back and every replica agrees on the delivery state, byte for byte.
        c.start(victim)
        c.wait_ready(timeout_s=60)
        for g in sorted(set(c.get("/v1/topics/jobs").json()["queue_groups"])):
            c.wait_replicas_equal(str(g), timeout_s=60)
        offsets = c.get("/v1/groups/workers/offsets", params={"topic": "jobs"}).json()["offsets"]
        assert offsets == {"0": 20, "1": 20, "2": 20}
        wait_until(lambda: all(c.alive(n) for n in c.nodes), 5, what="all nodes up")
