"""A rolling upgrade on a real 3-node cluster with API tokens: while n2 plays a node of the release
before capabilities (``faults.previous_release_node``: it advertises none and its queue-group
replicas refuse what that release refused), every replica of a group applies every entry alike;
a write with no safe older form answers 503 ``upgrade_in_progress``; once n2 is upgraded
(restarted without the fault) the newer forms are written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .cluster_changes import run_change
from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

ADMIN = "admin-token-Up7Gr4De9Qw2Er5Ty"
READER = "reader-token-Up3Lk8Mn1Bv6Cx4Z"  # consume on orders
# subscription_idle_ms 8 s (max_visibility_ms may not exceed it): the first test waits for the
# reader's invented group to expire after the upgrade; nothing uses that group meanwhile.
CONFIG = (
    "[limits]\nsubscription_idle_ms = 8000\nmax_visibility_ms = 8000\ndefault_visibility_ms = 1000\n"
    "[raft]\nretention_check_ms = 500\n"
    "[security]\n"
    f'[[security.tokens]]\nname = "admin"\ntoken = "{ADMIN}"\n'
    'admin = ["*"]\nproduce = ["*"]\nconsume = ["*"]\n'
    f'[[security.tokens]]\nname = "reader"\ntoken = "{READER}"\n'
    'admin = []\nproduce = []\nconsume = ["orders"]\n'
    '[faults]\nprevious_release_node = "n2"\n'
)


def receive(c: Cluster, token: str, group: str, node: str | None = None) -> Any:
    return c.session.post(
        c.url(node) + f"/v1/topics/orders/subscriptions/{group}/receive",
        json={"max": 1},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def commit(c: Cluster, offset: int) -> Any:
    """A consumer's commit (advance-only) of the group "offsets" on queue 0 of orders."""
    body = {"topic": "orders", "offsets": {"0": offset}, "advance": True}
    return c.session.put(c.url() + "/v1/groups/offsets/offsets", json=body, timeout=30)


def reader_commit(c: Cluster, group: str) -> Any:
    return c.session.put(
        c.url() + f"/v1/groups/{group}/offsets",
        json={"topic": "orders", "offsets": {"0": 1}},
        headers={"Authorization": f"Bearer {READER}"},
        timeout=30,
    )


def test_a_group_with_a_previous_release_voter_applies_every_entry_alike_until_the_upgrade(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, nodes=3, queue_groups=1, extra_toml=CONFIG) as c:
        c.session.headers["Authorization"] = f"Bearer {ADMIN}"
        c.start()
        c.wait_ready()
        c.wait_balanced()
        assert "capabilities" not in c.status("n2")
        assert "expire_subscriptions" in c.status("n1")["capabilities"]
        assert c.post("/v1/topics", {"name": "orders", "queues": 1}).status_code == 201
        assert c.produce("orders", [{"value": "a"}, {"value": "b"}]).status_code == 200
        group = str(c.get("/v1/topics/orders").json()["queues"][0]["group_id"])

        # A reader's receive would make an unconfigured group: no older form keeps its caps and
        # expiry, so it is refused, on every node, and nothing is stored.
        for node in c.nodes:
            r = receive(c, READER, "invented", node)
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "upgrade_in_progress" and error["retriable"] is True, r.text
        # So is the reader's offset commit under a new group (it would be one more unconfigured
        # group, as a receive's), and nothing is stored.
        r = reader_commit(c, "reader-made")
        assert r.status_code == 503 and r.json()["error"]["code"] == "upgrade_in_progress", r.text
        assert c.get("/v1/groups/reader-made/offsets?topic=orders").json()["offsets"] == {"0": None}
        # An admin's PUT is stored in its older form; its dead-letter topic waits for the upgrade.
        r = c.session.put(
            c.url() + "/v1/topics/orders/subscriptions/billing", json={"max_deliveries": 2}, timeout=30
        )
        assert r.status_code == 200, r.text
        assert "orders.billing.dlq" not in {t["name"] for t in c.get("/v1/topics").json()["topics"]}
        # The reader receives on the configured group (the older subscribe marks nothing new).
        r = receive(c, READER, "billing")
        assert r.status_code == 200 and len(r.json()["messages"]) == 1, r.text
        # A consumer's advance-only commit is written as a set (the older form): an older one
        # after a newer one still lands, on every replica alike.
        assert commit(c, 2).json()["offsets"] == {"0": {"offset": 2, "applied": True}}
        assert commit(c, 1).json()["offsets"] == {"0": {"offset": 1, "applied": True}}
        c.wait_replicas_equal(group)  # every replica, n2's included, applied every entry alike

        # The upgrade: n2 restarts without the fault; the gate opens and the newer forms are written.
        c.config_path.write_text(c.config_path.read_text().replace('previous_release_node = "n2"', ""))
        c.terminate("n2")
        c.start("n2")
        c.wait_ready()
        assert "subscribe.records" in c.status("n2")["capabilities"]

        def admitted() -> bool:
            return bool(receive(c, READER, "invented").status_code == 200)

        wait_until(admitted, 30, interval_s=0.5, what="the reader's new group admitted after the upgrade")
        r = reader_commit(c, "reader-made")
        assert r.status_code == 200, r.text

        def dead_letter_topic_made() -> bool:
            put = c.session.put(
                c.url() + "/v1/topics/orders/subscriptions/billing", json={"max_deliveries": 2}, timeout=30
            )
            assert put.status_code == 200, put.text
            return "orders.billing.dlq" in {t["name"] for t in c.get("/v1/topics").json()["topics"]}

        wait_until(
            dead_letter_topic_made, 30, interval_s=0.5, what="the PUT's dead-letter topic after the upgrade"
        )
        # Commits are advance-only now: an older one after a newer one is kept.
        assert commit(c, 2).status_code == 200
        wait_until(
            lambda: commit(c, 1).json()["offsets"] == {"0": {"offset": 2, "applied": False}},
            30,
            interval_s=0.5,
            what="advance-only commits after the upgrade",
        )
        c.wait_replicas_equal(group)
        # The idle unconfigured group expires (expire_subscriptions, proposed now that every voter
        # applies it), on every replica alike.
        wait_until(
            lambda: (
                "invented" not in {g["group"] for g in c.get("/v1/topics/orders/groups").json()["groups"]}
            ),
            60,
            interval_s=1,
            what="the idle unconfigured group to expire",
        )
        c.wait_replicas_equal(group)
        for nid in c.nodes:
            assert c.alive(nid), f"{nid} died:\n{c.log(nid)[-3000:]}"


def shared_bodies(c: Cluster, group: str) -> tuple[int, int]:
    """The group's bodies sealed once for several followers and the envelopes that sent them,
    summed over the nodes (``raftmq_raft_shared_bodies_sealed``, ``..._shared_body_envelopes``)."""
    names = ("raftmq_raft_shared_bodies_sealed_total", "raftmq_raft_shared_body_envelopes_total")
    totals = dict.fromkeys(names, 0)
    for node in c.nodes:
        for family in text_string_to_metric_families(c.get("/metrics", node).text):
            for s in family.samples:
                if s.name in totals and s.labels["group_id"] == group:
                    totals[s.name] += int(s.value)
    return totals[names[0]], totals[names[1]]


def test_entries_reach_a_replica_of_the_release_before_shared_bodies_and_every_replica_after_it(
    tmp_path: Path,
) -> None:
    """Entries over 16 KiB go to followers as a shared body behind an envelope of their own
    (cluster/replication/shared_bodies.py) only where the follower offered to read them in the
    Raft handshake: n2, of the release before, gets frames it reads (it hangs up on an envelope,
    as that release would), and after its upgrade every replica reads shared bodies. Each phase
    ends with every replica applying every entry alike and holding every message, and the nodes'
    counters show the bodies shared: one envelope a body while n2 is of the release before (n3
    alone reads them), more once it is upgraded (a body for both followers)."""
    config = '[faults]\nprevious_release_node = "n2"\n'
    with Cluster(tmp_path, nodes=3, queue_groups=1, extra_toml=config) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        assert c.post("/v1/topics", {"name": "big", "queues": 1}).status_code == 201
        group = str(c.get("/v1/topics/big").json()["queues"][0]["group_id"])
        values = [os.urandom(512).hex() for _ in range(32)]  # 1 KiB each, 32 KiB a request
        if c.wait_leader(group) == "n2":  # it would seal nothing: a leader that reads the mark
            run_change(c, "POST", f"/v1/cluster/groups/{group}/leader", {"node": "n1"})

        def produce_and_check(rounds: int, before: int) -> tuple[int, int]:
            """The bodies sealed and envelopes sent for the rounds."""
            sealed, envelopes = shared_bodies(c, group)
            for _ in range(rounds):
                r = c.produce("big", [{"value": v} for v in values])
                assert r.status_code == 200, r.text
            c.wait_replicas_equal(group)
            for node in c.nodes:
                held = c.fetch_all("big", 0, node, read_from="local")
                assert len(held) == before + rounds * len(values), node
                assert [m["value"] for m in held[before:]] == values * rounds
            after = shared_bodies(c, group)
            return after[0] - sealed, after[1] - envelopes

        sealed, envelopes = produce_and_check(20, 0)
        assert 0 < sealed == envelopes
        c.config_path.write_text(c.config_path.read_text().replace('previous_release_node = "n2"', ""))
        c.terminate("n2")
        c.start("n2")
        c.wait_ready()
        sealed, envelopes = produce_and_check(20, 20 * len(values))
        assert 0 < sealed < envelopes <= 2 * sealed
