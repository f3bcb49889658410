"""The pure helpers of tests/bench/bench_elections.py: reading the Raft counters of a node's
``/metrics`` (the metadata group's ``meta`` label with the queue groups' numbers) and the changes
per group between two samples."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from bench_scripts import loaded_bench

METRICS = """\
# HELP raftmq_raft_term Current Raft term of the replica
# TYPE raftmq_raft_term gauge
raftmq_raft_term{group_id="meta",node_id="n1"} 3.0
raftmq_raft_term{group_id="0",node_id="n1"} 2.0
raftmq_raft_term{group_id="1",node_id="n1"} 5.0
# TYPE raftmq_raft_became_leader_total counter
raftmq_raft_became_leader_total{group_id="meta",node_id="n1"} 1.0
raftmq_raft_became_leader_total{group_id="0",node_id="n1"} 0.0
raftmq_raft_became_leader_total{group_id="1",node_id="n1"} 2.0
raftmq_raft_became_leader_created{group_id="1",node_id="n1"} 1.7e+09
raftmq_raft_is_leader{group_id="1",node_id="n1"} 1.0
"""


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    yield from loaded_bench("bench_elections")


def test_counters_are_read_for_the_metadata_group_and_every_queue_group(bench: ModuleType) -> None:
    assert bench.parse_counters(METRICS) == {
        "became_leader": {"meta": 1.0, "0": 0.0, "1": 2.0},
        "term": {"meta": 3.0, "0": 2.0, "1": 5.0},
    }


def test_changes_sum_wins_over_replicas_and_take_each_groups_highest_term(bench: ModuleType) -> None:
    first = {
        "n1": {"became_leader": {"0": 1.0, "1": 0.0}, "term": {"0": 2.0, "1": 4.0}},
        "n2": {"became_leader": {"0": 0.0, "1": 1.0}, "term": {"0": 2.0, "1": 4.0}},
    }
    last = {
        "n1": {"became_leader": {"0": 1.0, "1": 1.0}, "term": {"0": 2.0, "1": 6.0}},
        "n2": {"became_leader": {"0": 0.0, "1": 2.0}, "term": {"0": 2.0, "1": 5.0}},
    }
    assert bench.changes(first, last) == {
        "0": {"leader_changes": 0.0, "term_increase": 0.0},
        "1": {"leader_changes": 2.0, "term_increase": 2.0},
    }
