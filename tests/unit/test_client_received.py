"""ReceivedMessage: settling rules (a message is settled once; extend keeps it unsettled) and the
subscriber's settings checks. No sockets: the settler is a recording test double."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from raftmq.client import ReceivedMessage
from raftmq.client._received import SettleOp
from raftmq.client._subscriber_config import SubscriberConfig

WIRE = {
    "receipt": "3.1.7.42",
    "attempt": 2,
    "queue": 1,
    "offset": 7,
    "deadline_ms": 1_000,
    "first_delivery_ms": 400,
    "key": "k",
    "value_b64": "AAEC",
    "headers": {"h": "v"},
    "timestamp_ms": 5,
}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, SettleOp, int | None]] = []

    def settle(self, message: ReceivedMessage, op: SettleOp, value: int | None) -> None:
        self.calls.append((message.receipt, op, value))


def received(settler: Any) -> ReceivedMessage:
    return ReceivedMessage.from_wire("orders", WIRE, settler)


def test_a_message_from_the_wire_has_its_fields_and_binary_value() -> None:
    m = received(None)
    assert (m.topic, m.queue, m.offset, m.receipt, m.attempt, m.deadline_ms) == (
        "orders",
        1,
        7,
        "3.1.7.42",
        2,
        1000,
    )
    assert (m.value, m.key, dict(m.headers), m.timestamp_ms) == (b"\x00\x01\x02", "k", {"h": "v"}, 5)
    assert m.first_delivery_ms == 400
    assert not m.settled
    older = {k: v for k, v in WIRE.items() if k != "first_delivery_ms"}  # a node of the release before
    assert ReceivedMessage.from_wire("orders", older, None).first_delivery_ms is None


def test_a_message_is_settled_once_and_extends_only_while_unsettled() -> None:
    recorder = Recorder()
    m = received(recorder)
    m.extend(5_000)
    m.nack(delay_ms=0)
    m.ack()  # after the nack: nothing
    m.nack()
    m.extend(1_000)
    assert recorder.calls == [("3.1.7.42", "extend", 5_000), ("3.1.7.42", "nack", 0)]
    assert m.settled


def test_bad_settle_arguments_raise_and_send_nothing() -> None:
    recorder = Recorder()
    m = received(recorder)
    with pytest.raises(ValueError):
        m.nack(delay_ms=-1)
    with pytest.raises(ValueError):
        m.extend(0)
    assert recorder.calls == [] and not m.settled


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"mode": "stream"}, "mode"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 10_001}, "max_in_flight"),
        ({"wait_ms": 15_001}, "wait_ms"),
        ({"ack_batch_size": 0}, "ack_batch_size"),
        ({"heartbeat_ms": 99}, "heartbeat_ms"),
        ({"visibility_ms": 0}, "visibility_ms"),
        ({"retry_timeout_ms": -1}, "retry_timeout_ms"),
    ],
)
def test_subscriber_settings_are_checked(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SubscriberConfig(topic="t", group="g", **settings).check()
    SubscriberConfig(topic="t", group="g").check()


def test_an_ack_and_a_nack_racing_on_two_threads_send_one_settlement() -> None:
    """Settling may be called from any thread: of an ack and a nack of one message racing on two
    threads, exactly one is sent (a thread switch between the check and the set let both through)."""
    recorder = Recorder()
    messages = [received(recorder) for _ in range(20_000)]
    start = threading.Barrier(2)

    def settle_all(op: SettleOp) -> None:
        start.wait()
        for m in messages:
            m.ack() if op == "ack" else m.nack(0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=settle_all, args=(op,)) for op in ("ack", "nack")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(recorder.calls) == len(messages)
    assert all(m.settled for m in messages)
