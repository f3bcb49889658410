"""A receiver long polling an empty queue costs few hops between nodes (cluster/node/receive_coordinator.py).

A waiting line arms an ``await`` at each queue group's leader elsewhere and waits up to 5 s on
them; it asks a leader to ``receive`` only when that group's replica on the waiting node shows
something to hand out, or its leader's ``await`` said so. Before, every second of a long poll
re-armed the awaits and asked every leader for a ``receive`` as well: 42-44 internal calls between
the nodes in a 10 s poll of an empty queue, through the SQS API and the REST API alike, so each
idle Celery worker or consumer kept the nodes busy. Real nodes, boto3 and HTTP; the hops counted
are the nodes' ``/internal/groups/{group}/{action}`` requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from .harness import Cluster
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(300)

ACTION_ROUTE = "/internal/groups/{group}/{action}"
POLL_S = 10
# A 10 s poll arms the awaits twice (5 s each) at the two or three groups led elsewhere, plus a
# forward to the coordinator; before the change it took 42-44.
MOST_HOPS = 14


def _hops(c: Cluster) -> int:
    return c.requests_served(ACTION_ROUTE)


def _terms(c: Cluster) -> dict[str, int]:
    return {g: int(c.status(c.wait_leader(g))["groups"][g]["term"]) for g in ("0", "1", "2")}


def _hops_of(c: Cluster, poll: Callable[[], Any]) -> int:
    """The hops of ``poll``, measured again once if an election crossed it (a leader unreachable
    for a moment makes the waiting line retry its awaits)."""
    for _ in range(2):
        terms, before = _terms(c), _hops(c)
        poll()
        hops = _hops(c) - before
        if _terms(c) == terms:
            return hops
    return hops


def test_an_sqs_long_poll_of_an_empty_queue_costs_few_hops(cluster: Cluster) -> None:
    for nid in cluster.nodes:
        sqs = sqs_client(cluster.url(nid))
        url = sqs.create_queue(QueueName=f"idle-{nid}")["QueueUrl"]
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)  # subscribed now
        hops = _hops_of(cluster, lambda s=sqs, u=url: s.receive_message(QueueUrl=u, WaitTimeSeconds=POLL_S))
        print(f"{nid}: {hops} hops in a {POLL_S} s SQS long poll of an empty queue")
        assert hops <= MOST_HOPS, f"{hops} hops between the nodes in a {POLL_S} s long poll on {nid}"


def test_a_rest_long_poll_of_an_empty_queue_costs_few_hops(cluster: Cluster) -> None:
    cluster.create_topic("idle-rest", queues=3)
    path = "/v1/topics/idle-rest/subscriptions/g/receive"
    assert cluster.post(path, {"max": 10, "wait_ms": 0}).status_code == 200
    for nid in cluster.nodes:

        def poll(n: str = nid) -> None:
            r = cluster.post(path, {"max": 10, "wait_ms": POLL_S * 1000}, node=n, timeout=POLL_S + 30)
            assert r.status_code == 200 and r.json()["messages"] == [], r.text

        hops = _hops_of(cluster, poll)
        print(f"{nid}: {hops} hops in a {POLL_S} s REST long poll of an empty queue")
        assert hops <= MOST_HOPS, f"{hops} hops between the nodes in a {POLL_S} s long poll on {nid}"


def test_a_message_sent_during_a_long_poll_ends_it_at_once(cluster: Cluster) -> None:
    """The waiting line still wakes for a message sent to a group led elsewhere."""
    for nid in cluster.nodes:
        sqs = sqs_client(cluster.url(nid))
        url = sqs.create_queue(QueueName=f"wake-{nid}")["QueueUrl"]
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
        other = sqs_client(cluster.url(next(n for n in cluster.nodes if n != nid)))
        sender = threading.Timer(2.0, lambda o=other, u=url: o.send_message(QueueUrl=u, MessageBody="late"))
        sender.start()
        started = time.monotonic()
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20).get("Messages", [])
        sender.join()
        assert [m["Body"] for m in got] == ["late"]
        assert time.monotonic() - started < 15, "the long poll did not wake for the message"
