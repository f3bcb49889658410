"""The SQS API on a cluster of its own: a queue group's leader killed while boto3 sends loses no
acknowledged send; a node whose metadata replica lags writes the RedrivePolicy it is sent, and
refuses a token's write-back (or CreateQueue) of a policy no longer in force (SigV4 on a cluster with tokens:
test_sqs_auth.py)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from .harness import Cluster, running, tokens_toml, wait_until
from .sqs_clients import sqs_client


def test_a_leader_killed_while_sending_loses_no_acknowledged_send(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        sqs = sqs_client(c.url("n1"), retries={"mode": "standard", "max_attempts": 10})
        url = sqs.create_queue(QueueName="failover")["QueueUrl"]
        topic = c.get("/v1/topics/failover").json()
        victim = next(q["leader"] for q in topic["queues"] if q["leader"] not in (None, "n1"))
        acked: list[str] = []
        failed: list[str] = []
        stop = threading.Event()

        def send() -> None:
            i = 0
            while not stop.is_set():
                body = f"m{i}"
                i += 1
                try:
                    if i % 3 == 0:
                        entries = [{"Id": str(j), "MessageBody": f"{body}.{j}"} for j in range(3)]
                        out = sqs.send_message_batch(QueueUrl=url, Entries=entries)
                        acked.extend(f"{body}.{s['Id']}" for s in out["Successful"])
                    else:
                        sqs.send_message(QueueUrl=url, MessageBody=body)
                        acked.append(body)
                except ClientError:
                    failed.append(body)  # not acknowledged: may or may not be stored

        sender = threading.Thread(target=send)
        sender.start()
        # The sends run 3 s before the kill and 8 s after it, and each phase waits for one
        # acknowledged at least: on a loaded machine boto3's first send, or one retried through
        # the election, may take longer than the phase.
        time.sleep(3)
        wait_until(lambda: acked, 60, what="a send acknowledged before the kill")
        before = len(acked)
        c.kill(victim)
        time.sleep(8)
        wait_until(lambda: len(acked) > before, 60, what="a send acknowledged after the kill")
        stop.set()
        sender.join(timeout=60)
        assert before > 0 and len(acked) > before, (before, len(acked), failed)
        received: set[str] = set()
        deadline = time.monotonic() + 90
        while not set(acked) <= received and time.monotonic() < deadline:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2).get(
                "Messages", []
            )
            received.update(m["Body"] for m in got)
            if got:
                sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(got)],
                )
        missing = set(acked) - received
        print(
            f"acknowledged {len(acked)} ({before} before the kill), unacknowledged {len(failed)}, "
            f"received {len(received)}"
        )
        assert not missing, f"{len(missing)} acknowledged sends lost of {len(acked)}: {sorted(missing)[:10]}"


def _pause(c: Cluster, nid: str, paused: bool) -> None:
    proc = c.nodes[nid].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


SETUP_ATTEMPTS = 5  # the setup's calls, and the change at the leader, ride out an election; the
# lagging node's write is sent once (a retry would not be the write under test)


def _policy_of(c: Cluster, node: str, topic: str) -> str:
    return str(c.get(f"/v1/topics/{topic}", node).json()["attributes"]["sqs.RedrivePolicy"])


def _wait_stored(c: Cluster, topic: str, dlq: str) -> None:
    """Every node ends with ``topic``'s RedrivePolicy naming ``dlq`` (the two paused catch up)."""

    def named() -> bool:
        targets = [json.loads(_policy_of(c, n, topic))["deadLetterTargetArn"] for n in c.nodes]
        return all(str(t).endswith(f":{dlq}") for t in targets)

    wait_until(named, 30, what=f"{topic}'s RedrivePolicy naming {dlq} on every node")


def _queues(c: Cluster, sqs: Any, prefix: str) -> tuple[str, Callable[[str], str]]:
    """``{prefix}-src`` sending its dead letters to ``{prefix}-dlq-a``, on every node; its URL
    and the policy naming a dead-letter queue (``{prefix}-dlq-a``, ``{prefix}-dlq-b``)."""
    for dlq in ("a", "b"):
        dlq_url = sqs.create_queue(QueueName=f"{prefix}-dlq-{dlq}")["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
    arn = got["Attributes"]["QueueArn"].removesuffix(f"{prefix}-dlq-b")

    def policy(dlq: str) -> str:
        return json.dumps({"deadLetterTargetArn": arn + dlq, "maxReceiveCount": 1})

    src = f"{prefix}-src"
    url = sqs.create_queue(QueueName=src, Attributes={"RedrivePolicy": policy(f"{prefix}-dlq-a")})
    for node in c.nodes:
        wait_until(lambda n=node: f"{prefix}-dlq-a" in _policy_of(c, n, src), 30, what=f"{src} on {node}")
    return url["QueueUrl"], policy


def _write_through_a_lagging_node(
    c: Cluster, change: Callable[[str], Any], write: Callable[[str], Any]
) -> list[Any]:
    """``change(leader)`` made while a follower of the metadata group is paused, then
    ``write(follower)`` sent to that follower once it resumes while the two others are paused
    (it hears from no leader, nor elects another), the leader resumed a second later: the
    follower's answer (or the ClientError it raised), in a list empty if none came."""
    leader = c.wait_leader("meta")
    lagging, other = (n for n in c.nodes if n != leader)
    answers: list[Any] = []

    def send() -> None:
        try:
            answers.append(write(lagging))
        except ClientError as e:
            answers.append(e)

    _pause(c, lagging, True)
    # Past pysyncobj's connection timeout (3.5 s): the leader dropped its connection to the
    # paused node, so the change below waits for a key exchange instead of sitting in its
    # socket buffer, read at once on resuming.
    time.sleep(5)
    try:
        change(leader)
        _pause(c, leader, True)  # the lagging node hears from no leader...
        _pause(c, other, True)  # ... nor elects another
        _pause(c, lagging, False)
        writer = threading.Thread(target=send)
        writer.start()
        time.sleep(1.0)  # the lagging node took the request: what it reads at the leader waits
        _pause(c, leader, False)
        writer.join(30)
    finally:
        for nid in c.nodes:
            _pause(c, nid, False)
    return answers


def test_a_lagging_node_writes_the_redrive_policy_it_is_sent(tmp_path: Path) -> None:
    """SetQueueAttributes took a RedrivePolicy equal to the queue's current one in the node's own
    metadata replica for no change and dropped it, though that replica may lag: the node that
    missed a change of the policy dropped a write of the former policy and answered success; the
    queue kept the other one. It writes it now (no tokens here: the write-back rule is only for a
    token refused on the dead-letter queue; that case below)."""
    with running(Cluster(tmp_path, nodes=3)) as c:

        def client(node: str, attempts: int = SETUP_ATTEMPTS) -> Any:
            return sqs_client(c.url(node), retries={"mode": "standard", "max_attempts": attempts})

        url, policy = _queues(c, client("n1"), "lag")

        answers = _write_through_a_lagging_node(
            c,
            lambda leader: client(leader).set_queue_attributes(
                QueueUrl=url, Attributes={"RedrivePolicy": policy("lag-dlq-b")}
            ),
            lambda node: client(node, 1).set_queue_attributes(
                QueueUrl=url, Attributes={"RedrivePolicy": policy("lag-dlq-a")}
            ),
        )
        assert len(answers) == 1 and not isinstance(answers[0], ClientError), answers
        _wait_stored(c, "lag-src", "lag-dlq-a")


ADMIN_TOKEN = "failover-admin-token-0123456789ab"
SRC_ADMIN_TOKEN = "failover-src-admin-token-01234567"  # admin on tok-src, no right on its DLQs


def test_a_lagging_node_refuses_a_stale_write_back_of_the_redrive_policy(tmp_path: Path) -> None:
    """A token refused on the dead-letter queue may write back the queue's current RedrivePolicy
    (dropped: no change), compared with the policy at the metadata leader. Compared with the
    node's own replica, a node that missed a change to policy B took a write-back of the former
    policy A by such a token for no change, answered success, and wrote nothing: the token passed
    a check meant for the policy in force. It is refused (AccessDenied) and B stays; so is a
    CreateQueue repeating policy A, which the node's replica answered with the queue's URL."""
    tokens = tokens_toml(
        [
            ("admin", ADMIN_TOKEN, '["*"]', '["*"]', '["*"]'),
            ("src-admin", SRC_ADMIN_TOKEN, '["tok-src"]', "[]", "[]"),
        ]
    )
    with running(Cluster(tmp_path, nodes=3, extra_toml=tokens), ADMIN_TOKEN) as c:

        def client(node: str, token: str, attempts: int = SETUP_ATTEMPTS) -> Any:
            r = c.get("/v1/sqs/credentials", node, headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
            keys = (r.json()["access_key_id"], r.json()["secret_access_key"])
            retries = {"mode": "standard", "max_attempts": attempts}
            return sqs_client(c.url(node), keys, region="us-east-1", retries=retries)

        url, policy = _queues(c, client("n1", ADMIN_TOKEN), "tok")
        # Before any pause: a client per node for each of the two calls, sent at once.
        writers = {node: client(node, SRC_ADMIN_TOKEN, 1) for node in c.nodes}
        creators = {node: client(node, SRC_ADMIN_TOKEN, 1) for node in c.nodes}
        stale = {"RedrivePolicy": policy("tok-dlq-a")}

        def write_back(node: str) -> list[Any]:
            """SetQueueAttributes and CreateQueue (a tool ensuring the queue exists with its
            attributes) with policy A, both while the node still holds it: their outcomes."""
            with ThreadPoolExecutor(2) as pool:
                calls = [
                    pool.submit(writers[node].set_queue_attributes, QueueUrl=url, Attributes=stale),
                    pool.submit(creators[node].create_queue, QueueName="tok-src", Attributes=stale),
                ]
            return [call.exception() or call.result() for call in calls]

        answers = _write_through_a_lagging_node(
            c,
            lambda leader: client(leader, ADMIN_TOKEN).set_queue_attributes(
                QueueUrl=url, Attributes={"RedrivePolicy": policy("tok-dlq-b")}
            ),
            write_back,
        )
        assert len(answers) == 1 and len(answers[0]) == 2, answers
        for answer in answers[0]:
            assert isinstance(answer, ClientError), answers
            assert answer.response["Error"]["Code"] == "AccessDenied", answer.response
        _wait_stored(c, "tok-src", "tok-dlq-b")
