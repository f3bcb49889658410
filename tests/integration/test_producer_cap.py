"""Idempotent producer states are capped per queue group (limits.max_producer_states) on a live
cluster: a client appending one-message batches under ever new producer ids through the REST
produce API leaves at most the cap, the most recent producers stay deduplicated, and every replica
holds the same states. Before, each such batch left a state for limits.producer_idle_ms (7 days)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Cluster, wait_until
from .test_producer_expiry import offset, producer_keys

pytestmark = pytest.mark.timeout(120)

CAP = 5
PRODUCERS = [f"p{i:02}" for i in range(40)]
CONFIG = "[limits]\nmax_producer_states = {cap}\nproducer_idle_ms = {idle}\n"
CONFIG += "[raft]\nretention_check_ms = 200\n"


# producer_idle_ms = 0 (states never forgotten for idleness) held no cap at first (review): the cap
# is what bounds them then.
@pytest.mark.parametrize("idle_ms", [7 * 24 * 3600 * 1000, 0])
def test_new_producer_ids_past_the_cap_forget_the_least_recently_used(tmp_path: Path, idle_ms: int) -> None:
    with Cluster(tmp_path, queue_groups=1, extra_toml=CONFIG.format(cap=CAP, idle=idle_ms)) as c:
        c.start()
        c.wait_ready()
        c.create_topic("t", queues=1)
        # The group's leader sends the cap with its first expiry step.
        wait_until(lambda: any("producer_cap_set" in c.log(nid) for nid in c.nodes), timeout_s=30)
        first = {p: offset(c, p, 0) for p in PRODUCERS}  # one batch each, through every node
        # The most recent producers are still deduplicated: a retry answers the original offset.
        for p in PRODUCERS[-CAP:]:
            r = c.produce("t", [{"value": f"{p}-0"}], producer_id=p, sequence=0)
            assert r.status_code == 200 and r.json()["results"][0]["offset"] == first[p], r.text
        # The least recently used are forgotten: a retry of the first is stored again (as after
        # its idle time), and its new state forgets the next least recently used.
        assert offset(c, PRODUCERS[0], 0) > first[PRODUCERS[-1]]
        c.wait_replicas_equal("0")
        for nid in list(c.nodes):
            c.terminate(nid)

    replicas = [producer_keys(c.data_dir / nid / "groups" / "0" / "state") for nid in c.nodes]
    assert all(r == replicas[0] for r in replicas), "replicas differ"
    kept = [*PRODUCERS[1 - CAP :], PRODUCERS[0]]
    assert sorted(replicas[0]) == sorted(f"{k} {p}" for p in kept for k in "PW"), sorted(replicas[0])
