"""A node whose clock is two days ahead leads a queue group (issue 19's probes, on a live cluster):
its stamps are clamped by the group's time, so retention removes nothing early, receive still hands
out what the topic keeps, and the clamp is logged and counted. The node's clock is moved with the
``RAFTMQ_TEST_CLOCK_OFFSET_MS`` test fault (``cluster/base/clock.py``)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from .cluster_changes import run_change
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(240)

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def bounds(c: Cluster, topic: str, node: str) -> tuple[int, int]:
    q = c.get(f"/v1/topics/{topic}", node).json()["queues"][0]
    return q["low_offset"], q["high_offset"]


def receive(c: Cluster, topic: str, group: str, node: str) -> list[dict[str, Any]]:
    body = {"wait_ms": 0, "max": 10, "visibility_ms": 60_000}
    r = c.post(f"/v1/topics/{topic}/subscriptions/{group}/receive", body, node=node)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def fetch_local(c: Cluster, topic: str, node: str, **kw: Any) -> Any:
    path = f"/v1/topics/{topic}/queues/0/messages?offset=0&wait_ms=0&read_from=local"
    return c.get(path, node, **kw)


def clock_jumps(c: Cluster, node: str) -> int:
    text = c.get("/metrics", node).text
    found = re.search(r'^raftmq_group_clock_jumps_total\{[^}]*group_id="0"[^}]*\} (\S+)$', text, re.M)
    assert found, "raftmq_group_clock_jumps_total of group 0 missing"
    return int(float(found.group(1)))


def test_a_leader_two_days_ahead_removes_and_hides_nothing_early(tmp_path: Path) -> None:
    with Cluster(tmp_path, queue_groups=1) as c:
        # The sane nodes never tick retention: the group has no earlier retention run to compare
        # the skewed leader's first one with (the probe's young topic).
        c.start(env={"RAFTMQ_RAFT_RETENTION_CHECK_MS": str(HOUR_MS)})
        c.wait_ready()
        c.create_topic("young", queues=1, retention_ms=HOUR_MS)
        c.create_topic("daily", queues=1, retention_ms=DAY_MS)
        for i in range(3):
            assert c.produce("young", [{"value": f"y{i}"}]).status_code == 200
        for i in range(2):
            assert c.produce("daily", [{"value": f"d{i}"}]).status_code == 200
        sane = c.wait_leader("0")
        skewed = next(n for n in c.nodes if n != sane)
        c.kill(skewed)
        c.start(
            skewed,
            env={"RAFTMQ_TEST_CLOCK_OFFSET_MS": str(2 * DAY_MS), "RAFTMQ_RAFT_RETENTION_CHECK_MS": "2000"},
        )
        c.wait_ready()

        # A fetch from the skewed replica judges expiry on the group's time, not its clock: it
        # hides nothing and skips nothing (JSON), and tells a binary reader the same time.
        wait_until(
            lambda: fetch_local(c, "daily", skewed).json()["high_offset"] == 2, 30, what="replica caught up"
        )
        answer = fetch_local(c, "daily", skewed).json()
        assert [m["value"] for m in answer["messages"]] == ["d0", "d1"]
        assert answer["next_offset"] == 2
        binary = fetch_local(c, "daily", skewed, headers={"Accept": "application/vnd.raftmq.batch"})
        assert binary.status_code == 200
        assert int(binary.headers["X-Raftmq-Now-Ms"]) < time.time() * 1000 + HOUR_MS

        run_change(c, "POST", "/v1/cluster/groups/0/leader", {"node": skewed})
        wait_until(lambda: c.leader("0") == skewed, 30, what="the skewed node leads group 0")

        # At once: the skewed leader's first retention tick (every 2 s) comes after its first
        # stamp, as in the probe.
        assert c.produce("young", [{"value": "from the future"}], node=skewed).status_code == 200
        time.sleep(6)  # 3 retention ticks of the skewed leader
        assert bounds(c, "young", skewed) == (0, 4)
        assert [m["value"] for m in receive(c, "daily", "billing", skewed)] == ["d0", "d1"]
        assert clock_jumps(c, skewed) >= 1
        assert "group_clock_jump" in c.log(skewed)

        # Back on a true clock, the group goes on: nothing was lost, new receives still work.
        run_change(c, "POST", "/v1/cluster/groups/0/leader", {"node": sane})
        wait_until(lambda: c.leader("0") == sane, 30, what="the sane node leads group 0 again")
        assert bounds(c, "young", sane) == (0, 4)
        assert [m["value"] for m in receive(c, "daily", "audit", sane)] == ["d0", "d1"]


def test_a_led_group_without_retention_is_stamped_well_within_the_bound(tmp_path: Path) -> None:
    # Its time takes a gap of more than the bound between stamps for a clock jump (and runs late
    # by the excess), so its leader stamps it every third of the bound even when nothing happens.
    toml = "[raft]\nretention_check_ms = 200\nretention_max_jump_ms = 600\n"
    with Cluster(tmp_path, queue_groups=1, extra_toml=toml) as c:
        c.start()
        c.wait_ready()
        leader = c.wait_leader("0")
        first = c.status(leader)["groups"]["0"]["applied_index"]
        time.sleep(3)
        later = c.status(leader)["groups"]["0"]["applied_index"]
        assert later - first >= 5, (first, later)  # an empty retain every 200-400 ms
