"""A receive/ack group's lag counts every queue (issue 21, item 2): `GET /v1/topics/lines/groups`
showed the lag of the one queue group a group had received from (25,525 of ~101,494 never
received, one queue listed); the console's lag chart (`…/groups/lag`, sampled by the nodes) and
the metric showed the same number."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(120)

QUEUES = 6
PER_QUEUE = 50


def test_a_receive_ack_groups_lag_is_every_message_not_acked_on_every_queue(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3, extra_toml="[limits]\nlag_sample_ms = 200\n") as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()  # one leader per group (the metrics below come from the leaders)
        topic = c.create_topic("lines", queues=QUEUES)
        assert len(set(topic["queue_groups"])) == 3  # the group's state is in three stores
        messages = [{"value": f"m{i}", "queue": i % QUEUES} for i in range(QUEUES * PER_QUEUE)]
        assert c.produce("lines", messages).status_code == 200
        r = c.post("/v1/topics/lines/subscriptions/rx/receive", {"max": 4, "visibility_ms": 60_000})
        assert r.status_code == 200 and len(r.json()["messages"]) == 4, r.text
        received = r.json()["messages"]
        r = c.post(
            "/v1/topics/lines/subscriptions/rx/ack", {"receipts": [m["receipt"] for m in received[:2]]}
        )
        assert r.status_code == 200, r.text
        total = QUEUES * PER_QUEUE
        # Two acked (if the floor moved past them; else still lag), two in flight: lag counts
        # what is not done, so it is total - 2 at least and total at most.
        (rx,) = [g for g in c.get("/v1/topics/lines/groups").json()["groups"] if g["group"] == "rx"]
        assert sorted(q["queue"] for q in rx["queues"]) == list(range(QUEUES))
        assert total - 2 <= rx["lag"] <= total, rx
        assert rx["lag"] == sum(q["lag"] for q in rx["queues"])
        assert rx["in_flight"] == 2

        # The console's chart reads the lag the nodes sample: it comes to the same count.
        def sampled() -> list[list[int]]:
            answer = c.get("/v1/topics/lines/groups/lag").json()
            return [s for g in answer["groups"] if g["group"] == "rx" for s in g["samples"]]

        wait_until(lambda: (s := sampled()) and s[-1][1] == rx["lag"], 30, what="rx's lag sampled")
        # Each node's metrics cover the queue groups it leads: all of them, summed.
        lags = [
            float(line.rsplit(" ", 1)[1])
            for node in c.nodes
            for line in c.get("/metrics", node).text.splitlines()
            if line.startswith("raftmq_consumer_lag_messages{") and 'group="rx"' in line
        ]
        assert len(lags) == QUEUES and sum(lags) == rx["lag"], lags
