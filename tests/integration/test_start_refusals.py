"""A node that cannot open its stores at start (a full disk, a store another process holds) says so
in one line and exits, instead of a traceback and unclosed sessions; started again once the cause
is gone, it catches up."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.storage.rocks import RocksStore

from .harness import Cluster

pytestmark = pytest.mark.timeout(240)


def test_a_node_whose_store_cannot_open_exits_with_one_line_and_starts_once_it_can(tmp_path: Path) -> None:
    with Cluster(tmp_path, queue_groups=1) as c:
        c.start()
        c.wait_ready()
        c.create_topic("t", queues=1)
        victim = next(n for n in c.nodes if n != c.wait_leader("0"))
        c.kill(victim)
        # Another process holds the group's state store (RocksDB's LOCK): opening it fails at start,
        # on the same road as a disk too full for RocksDB to open a store.
        held = RocksStore.open(str(c.data_dir / victim / "groups" / "0" / "state"))
        try:
            log = c.start_refused(victim)
            assert f"node {victim} cannot open its stores:" in log, log[-3000:]
            assert "Is another raftmq process using this data directory?" in log
            assert "Traceback" not in log, log[-3000:]
            assert "Unclosed client session" not in log, log[-3000:]
        finally:
            held.close()
        c.start(victim)
        c.wait_ready([victim], timeout_s=60)
        c.wait_replicas_equal("0", timeout_s=60)
