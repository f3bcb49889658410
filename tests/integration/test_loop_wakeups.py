"""A follower's applies wake its event loop only when something on it waits for them.

Every replica applies every entry; on a follower, an apply that only grew queues used to wake the
node's loop each time (the sealer drops a follower's growth, and nobody waited). It now does so
only while a fetch long poll or a receive waits on that node (cluster/node/waiters.py), and such a
waiter is still woken by the apply that brings its message.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(180)

ENTRIES = 40


def _wakeups(c: Cluster, node: str) -> float:
    for family in text_string_to_metric_families(c.get("/metrics", node).text):
        for sample in family.samples:
            if sample.name == "raftmq_loop_wakeups_total":
                return float(sample.value)
    raise AssertionError(f"{node} has no raftmq_loop_wakeups_total")


def _applied(c: Cluster, node: str) -> int:
    return int(c.status(node)["groups"]["0"]["applied_index"])


def test_a_follower_wakes_its_loop_for_applies_only_while_a_long_poll_waits_there(tmp_path: Path) -> None:
    with Cluster(tmp_path, queue_groups=1) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        leader = c.wait_leader("0")
        busy = {leader, c.leader("meta")}  # a follower of group 0 that leads nothing, if there is one
        follower = next((n for n in c.nodes if n not in busy), next(n for n in c.nodes if n != leader))
        c.create_topic("w", queues=1, node=leader)

        # Nobody waits on the follower: its applies of single-message entries wake nothing.
        before = _wakeups(c, follower)
        for i in range(ENTRIES):
            r = c.produce("w", [{"value": f"m{i}", "queue": 0}], node=leader)
            assert r.status_code == 200, r.text
        last = _applied(c, leader)
        wait_until(lambda: _applied(c, follower) >= last, 10, what="the follower applied every entry")
        quiet = _wakeups(c, follower) - before
        # Its own reads show the last message before the long poll asks past it (CI once saw the
        # follower's status report the entry applied while a local read still ended at 39).
        tail = f"/v1/topics/w/queues/0/messages?offset={ENTRIES - 1}&read_from=local"
        wait_until(
            lambda: [m["value"] for m in c.get(tail, follower).json()["messages"]] == [f"m{ENTRIES - 1}"],
            10,
            what="the follower's local read showing the last message",
        )
        assert quiet < ENTRIES / 4, f"{quiet} loop wake-ups on a follower for {ENTRIES} entries"

        # A long poll on the follower's own replica waits: the apply that brings the next
        # message wakes it (it answers with the message, not empty at the end of wait_ms).
        got: list[Any] = []
        path = f"/v1/topics/w/queues/0/messages?offset={ENTRIES}&wait_ms=10000&read_from=local"
        poll = threading.Thread(target=lambda: got.append(c.get(path, follower).json()))
        before = _wakeups(c, follower)
        poll.start()
        time.sleep(1.0)  # it has read the queue (nothing at that offset) and waits
        assert poll.is_alive(), got
        r = c.produce("w", [{"value": "late", "queue": 0}], node=leader)
        assert r.status_code == 200, r.text
        poll.join(timeout=30)
        assert not poll.is_alive()
        assert [m["value"] for m in got[0]["messages"]] == ["late"]
        assert _wakeups(c, follower) > before
