"""Idle idempotent producer states expire on a live cluster (limits.producer_idle_ms), driven by the
leader's retention timer; a producer active meanwhile keeps its state."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from raftmq.storage import keys
from raftmq.storage.keys import ProducerState
from raftmq.storage.queues import scan_prefix
from raftmq.storage.rocks import RocksStore

from .harness import Cluster

pytestmark = pytest.mark.timeout(120)

IDLE_MS = 5000  # well above the active producer's gaps (0.5 s and a request), even on a slow machine
SHORT = [f"short-{i:02}" for i in range(20)]
CONFIG = f"[limits]\nproducer_idle_ms = {IDLE_MS}\n[raft]\nretention_check_ms = 200\n"


def expired_so_far(c: Cluster) -> int:
    """States the leaders reported forgotten (``producers_expired`` log lines of every node)."""
    return sum(int(n) for nid in c.nodes for n in re.findall(r"producers_expired\s.*count=(\d+)", c.log(nid)))


def offset(c: Cluster, producer: str, sequence: int) -> int:
    r = c.produce("t", [{"value": f"{producer}-{sequence}"}], producer_id=producer, sequence=sequence)
    assert r.status_code == 200, r.text
    result: int = r.json()["results"][0]["offset"]
    return result


def producer_keys(state_dir: Path) -> dict[str, ProducerState | int]:
    """The producer states (``P``) and idle-index keys (``W``, by producer: last-used time) of a
    stopped replica, read from its RocksDB."""
    store = RocksStore.open(str(state_dir))
    try:
        found: dict[str, ProducerState | int] = {}
        for k, v in scan_prefix(store, keys.PRODUCER):
            found["P " + keys.decode_producer_key(k)[2]] = ProducerState.decode(v)
        for k, _ in scan_prefix(store, keys.PRODUCER_IDLE):
            last_used_ms, _, _, producer = keys.decode_producer_idle_key(k)
            found["W " + producer] = last_used_ms
        return found
    finally:
        store.close()


def test_idle_producer_states_go_away_and_an_active_producer_keeps_its_state(tmp_path: Path) -> None:
    with Cluster(tmp_path, queue_groups=1, extra_toml=CONFIG) as c:
        c.start()
        c.wait_ready()
        c.create_topic("t", queues=1)
        first = {p: offset(c, p, 0) for p in SHORT}  # short-lived producers: one batch each
        started = time.monotonic()
        active = [offset(c, "active", 0)]
        assert expired_so_far(c) == 0

        # The active producer writes every 0.5 s (under the idle time) until the others are gone
        # and it has been active for longer than the idle time. (Timed, not counted: on a slow
        # machine fewer writes fit in that time.)
        deadline = started + 60
        while expired_so_far(c) < len(SHORT) or time.monotonic() - started < IDLE_MS / 1000 + 1:
            assert time.monotonic() < deadline, "short-lived producer states were not expired"
            time.sleep(0.5)
            active.append(offset(c, "active", len(active)))

        # The active producer's state is intact: its recent batches are still recognised.
        newest = len(active) - 1
        for sequence in (newest - 2, newest):
            assert offset(c, "active", sequence) == active[sequence]
        # A forgotten producer is new to the queue: its old batch is stored again, at a new offset.
        again = offset(c, SHORT[0], 0)
        assert again > first[SHORT[0]]
        # One more batch of the active producer, so that it is far from idle while the replicas
        # are compared and stopped below (its state must be there when they stop).
        active.append(offset(c, "active", len(active)))
        newest = len(active) - 1
        assert expired_so_far(c) == len(SHORT)

        digest = c.wait_replicas_equal("0")
        for nid in list(c.nodes):
            c.terminate(nid)

    # Every replica holds exactly the two live states, each with its one idle-index key.
    replicas = [producer_keys(c.data_dir / nid / "groups" / "0" / "state") for nid in c.nodes]
    assert all(r == replicas[0] for r in replicas), "replicas differ"
    found = replicas[0]
    assert sorted(found) == sorted(["P active", "W active", f"P {SHORT[0]}", f"W {SHORT[0]}"]), digest
    state = found["P active"]
    assert isinstance(state, ProducerState) and state.last_used_ms == found["W active"]
    assert [seq for seq, _, _ in state.entries] == list(range(max(0, newest - 4), newest + 1))
