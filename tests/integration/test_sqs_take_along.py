"""A send's take-along (docs/sqs.md, Read-ahead), with the real boto3 against real 3-node clusters:
a SendMessageBatch to a node where a ReceiveMessage of the queue waits (long poll) hands its
messages to that receive in the send's own Raft entry (``append.take``), so the receive writes no
entry of its own; and a node killed while its receivers and senders cycle loses no acknowledged
send (what its entries took along for receives that died with it comes back at its visibility
deadline); while a voter runs the release before ``append.take``, a send takes nothing along.
Each test checks the node's ``raftmq_read_ahead_messages`` counters."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError
from prometheus_client.parser import text_string_to_metric_families

from .conftest import describe
from .harness import Cluster, wait_until
from .sqs_clients import sqs_client
from .test_sqs_read_ahead import COUNT, _delete, _entries, _read_ahead

pytestmark = pytest.mark.timeout(300)

CYCLES = 6


def _waiting(c: Cluster, nid: str, queue: str) -> int:
    """The receivers waiting at ``nid`` in the lines of topic ``queue`` (``raftmq_receivers_waiting``)."""
    n = 0
    for family in text_string_to_metric_families(c.get("/metrics", nid).text):
        for s in family.samples:
            if s.name == "raftmq_receivers_waiting" and s.labels.get("topic") == queue:
                n += int(s.value)
    return n


# What a call raises when its node is killed: refused (EndpointConnectionError), reset
# (ConnectionClosedError), an error answer: botocore's root classes.
GONE = (ClientError, BotoCoreError)


class Receiver:
    """One ReceiveMessage (long poll) in a thread of its own; whatever it raises is kept, and
    :meth:`messages` raises it (a thread that died of it would look like a receive that got
    nothing)."""

    def __init__(self, sqs: Any, url: str, wait_s: int = 10) -> None:
        self.answer: dict[str, Any] = {}
        self.failed: Exception | None = None

        def receive() -> None:
            try:
                self.answer.update(
                    sqs.receive_message(
                        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s, AttributeNames=COUNT
                    )
                )
            except Exception as e:
                self.failed = e

        self.thread = threading.Thread(target=receive)
        self.thread.start()

    def messages(self) -> list[dict[str, Any]]:
        """What it received (raises what it failed with, and fails when it has not returned)."""
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the ReceiveMessage has not returned in 60 s"
        if self.failed is not None:
            raise self.failed
        return list(self.answer.get("Messages", []))


def test_a_receive_waiting_on_the_node_is_served_by_the_sends_entry(cluster: Cluster) -> None:
    name = "take-along-cycles"
    sqs = sqs_client(cluster.url("n2"))
    url = sqs.create_queue(QueueName=name)["QueueUrl"]  # VisibilityTimeout 30 s
    before = _read_ahead(cluster, "n2")
    written, seen = 0, []
    for cycle in range(CYCLES):
        receiver = Receiver(sqs, url)
        wait_until(lambda: _waiting(cluster, "n2", name) >= 1, 30, what="the receive waiting at n2")
        start = _entries(cluster)
        entries = [{"Id": str(i), "MessageBody": f"c{cycle}-{i}"} for i in range(10)]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
        got = receiver.messages()
        written += _entries(cluster) - start
        assert len(got) == 10, got
        seen += got
        _delete(sqs, url, got)

    after = _read_ahead(cluster, "n2")
    assert after.get("taken_by_send", 0) - before.get("taken_by_send", 0) == 10 * CYCLES
    assert after["handed_out"] - before.get("handed_out", 0) == 10 * CYCLES
    # A send and a receive were two entries a cycle; now the send's alone (a stray entry of the
    # cluster's own, a tick, allowed for).
    assert written < CYCLES + CYCLES // 2, written
    assert sorted(m["Body"] for m in seen) == sorted(f"c{c}-{i}" for c in range(CYCLES) for i in range(10))
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in seen} == {"1"}
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


def test_a_node_killed_mid_cycle_loses_no_acknowledged_send(tmp_path: Path) -> None:
    """n2's receivers long poll and its senders send (each send to a queue group n2 leads: its
    entries take messages along for the receives waiting there) until n2 is killed mid-cycle.
    Every send acknowledged is received on the nodes left: what n2 took along for receives that
    died with it is visible again at its visibility deadline (10 s here, the shortest a
    take-along is made for, plus its hold)."""
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        name = "take-along-kill"
        sqs = sqs_client(c.url("n2"), retries={"mode": "standard", "max_attempts": 1})
        url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "10"})["QueueUrl"]
        acked: list[str] = []
        received: set[str] = set()
        stop, killing = threading.Event(), threading.Event()
        unexpected: list[str] = []  # failures of the cycle before n2's kill, or of another kind

        def cycle() -> None:
            i = 0
            receiver = None
            while not stop.is_set():
                try:
                    receiver = Receiver(sqs, url, wait_s=2)
                    entries = [{"Id": str(j), "MessageBody": f"m{i}-{j}"} for j in range(10)]
                    out = sqs.send_message_batch(QueueUrl=url, Entries=entries)
                    acked.extend(f"m{i}-{s['Id']}" for s in out["Successful"])
                    got = receiver.messages()
                    received.update(m["Body"] for m in got)
                    if got:
                        _delete(sqs, url, got)
                except Exception as e:
                    if not (killing.is_set() and isinstance(e, (*GONE, AssertionError))):
                        unexpected.append(repr(e))
                    if receiver is not None:
                        receiver.thread.join(timeout=60)
                    return  # n2 is gone
                i += 1

        worker = threading.Thread(target=cycle)
        worker.start()
        wait_until(lambda: _read_ahead(c, "n2").get("taken_by_send", 0) >= 30, 60, what="n2's take-alongs")
        killing.set()
        c.kill("n2")
        stop.set()
        worker.join(timeout=60)
        assert not worker.is_alive() and not unexpected, unexpected

        other = sqs_client(c.url("n1"), retries={"mode": "standard", "max_attempts": 10})
        deadline = time.monotonic() + 90
        while not set(acked) <= received and time.monotonic() < deadline:
            got = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2).get(
                "Messages", []
            )
            received.update(m["Body"] for m in got)
            if got:
                _delete(other, url, got)
        missing = set(acked) - received
        print(f"acknowledged {len(acked)}, received {len(received)}")
        assert acked and not missing, f"{len(missing)} acknowledged sends lost: {sorted(missing)[:10]}"


def test_while_a_voter_runs_the_release_before_a_send_takes_nothing_along(tmp_path: Path) -> None:
    """n4 plays the release before capabilities (no ``append.take``): a node whose every led queue
    group has n4 as a voter writes plain appends, and its waiting receives are served as before
    (an entry of their own); nothing is lost or received twice."""
    fault = '[faults]\nprevious_release_node = "n4"\n'
    with Cluster(tmp_path, nodes=4, replication=3, queue_groups=4, extra_toml=fault) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        assert "append.take" not in c.status("n4").get("capabilities", [])
        name = "take-along-upgrade"
        sqs_client(c.url("n1")).create_queue(QueueName=name)
        queues = describe(c, name)["queues"]
        entry = next(
            (
                nid
                for nid in ("n1", "n2", "n3")
                if any(q["leader"] == nid for q in queues)
                and all("n4" in q["replicas"] for q in queues if q["leader"] == nid)
            ),
            None,
        )
        if entry is None:
            pytest.skip(f"no node other than n4 leads only groups n4 is a voter of: {queues}")
        sqs = sqs_client(c.url(entry))
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        before = _read_ahead(c, entry)
        seen: list[dict[str, Any]] = []
        for cycle in range(3):
            receiver = Receiver(sqs, url)
            wait_until(lambda: _waiting(c, entry, name) >= 1, 30, what=f"the receive waiting at {entry}")
            entries = [{"Id": str(i), "MessageBody": f"c{cycle}-{i}"} for i in range(10)]
            assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
            got = receiver.messages()
            for _ in range(10):  # the rest at the next receives (a receive takes what it finds)
                if len(got) == 10:
                    break
                more = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10 - len(got), WaitTimeSeconds=1)
                got += more.get("Messages", [])
            seen += got
            _delete(sqs, url, got)
        assert _read_ahead(c, entry).get("taken_by_send", 0) == before.get("taken_by_send", 0)
        assert sorted(m["Body"] for m in seen) == sorted(f"c{c_}-{i}" for c_ in range(3) for i in range(10))
