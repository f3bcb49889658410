"""A chaos run's verdict: every checker, the recovery, every drain, and every replica caught up."""

from __future__ import annotations

from typing import Any

from raftmq.chaos.runner import verdict


def _run(**changes: Any) -> dict[str, Any]:
    run_info: dict[str, Any] = {
        "recovery_s": 1.5,
        "drain": {"complete": True},
        "receive_drain": {"complete": True},
        "replicas": {"lagging_replicas": {}},
    }
    return run_info | changes


def test_a_run_whose_checks_drains_and_replicas_are_whole_is_valid() -> None:
    assert verdict({"valid": True}, _run())


def test_a_replica_behind_what_was_acknowledged_makes_the_run_invalid() -> None:
    # A leader whose clock jumped removed its queues: the checkers, reading through the leaders,
    # saw nothing lost while both replicas were unreadable from offset 0; the verdict said VALID.
    lagging = {"replicas": {"lagging_replicas": {"0@n1": -1, "1@n1": -1}}}
    assert not verdict({"valid": True}, _run(**lagging))


def test_each_other_part_of_the_verdict_can_make_a_run_invalid() -> None:
    assert not verdict({"valid": False}, _run())
    assert not verdict({"valid": True}, _run(recovery_s=None))
    assert not verdict({"valid": True}, _run(drain={"complete": False}))
    assert not verdict({"valid": True}, _run(receive_drain={"complete": False}))
    assert not verdict({"valid": True}, _run(sqs_drain={"complete": False}))
