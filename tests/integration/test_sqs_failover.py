"""The SQS API on clusters of their own: a queue group's leader killed while boto3 sends loses no
acknowledged send, and a cluster with API tokens refuses every SQS request (no SigV4 check yet)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError

from .harness import PEER_KEY, Cluster
from .sqs_clients import sqs_client

ADMIN_TOKEN = "sqs-admin-token-0123456789abcdef"


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
        time.sleep(3)
        before = len(acked)
        c.kill(victim)
        time.sleep(8)
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


SECURITY_TOML = f"""
[security]
[[security.tokens]]
name = "admin"
token = "{ADMIN_TOKEN}"
admin = ["*"]
produce = ["*"]
consume = ["*"]
"""


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with Cluster(tmp_path_factory.mktemp("secure"), nodes=3, extra_toml=SECURITY_TOML) as c:
        c.start()
        c.wait_ready()
        yield c


def test_a_cluster_with_tokens_refuses_every_sqs_request(secure: Cluster) -> None:
    sqs = sqs_client(secure.url("n1"), retries={"max_attempts": 1})
    for call in (
        lambda: sqs.create_queue(QueueName="locked-out"),
        lambda: sqs.list_queues(),
        lambda: sqs.send_message(QueueUrl=f"{secure.url('n1')}/000000000000/locked-out", MessageBody="x"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == "InvalidClientTokenId"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    json_headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"}
    body = b'{"QueueName": "locked-out"}'
    # Neither a raftmq token nor the peer key opens it: SQS requests are refused before either is read.
    for extra in ({"Authorization": f"Bearer {ADMIN_TOKEN}"}, {"X-Raftmq-Peer-Key": PEER_KEY}, {}):
        r = requests.post(secure.url("n2") + "/", data=body, headers={**json_headers, **extra}, timeout=10)
        assert r.status_code == 403 and r.headers["x-amzn-query-error"] == "InvalidClientTokenId;Sender"
        assert ADMIN_TOKEN not in r.text and PEER_KEY not in r.text
    r = requests.post(
        secure.url("n3") + "/000000000000/locked-out",
        data={"Action": "SendMessage", "MessageBody": "x"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 403 and "<Code>InvalidClientTokenId</Code>" in r.text
    topics = secure.get("/v1/topics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["topics"]
    assert "locked-out" not in [t["name"] for t in topics]
