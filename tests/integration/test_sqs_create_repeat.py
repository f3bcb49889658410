"""CreateQueue of an existing queue repeating its attributes, its RedrivePolicy among them, with a
token that has ``admin`` on the queue and no right on its dead-letter queue, on a real 3-node
cluster with API tokens (docs/sqs.md, Authentication; docs/security.md).

A tool that ensures a queue exists with its attributes at every start (Terraform-like, a service's
own setup) sends CreateQueue with them all: the queue's current RedrivePolicy is no change and
needs no right on the dead-letter queue, on both wires, for a standard and a FIFO queue, however
the policy is written; the answer is the queue's URL and nothing is written. Another policy, a new
queue with one, or a token without ``admin`` on the queue are refused as before (``AccessDenied``,
the right checked before the dead-letter queue is looked up), and other differing attributes are
``QueueAlreadyExists``, as AWS answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster, running, tokens_toml, wait_until
from .sqs_clients import query_sqs_client, sqs_client

pytestmark = pytest.mark.timeout(240)

ARN = "arn:aws:sqs:us-east-1:000000000000:"  # the cluster's default [sqs] region
SRC, DLQ, SRC_FIFO, DLQ_FIFO = "ensure-src", "other-dlq", "ensure-src.fifo", "other-dlq.fifo"
ADMIN_TOKEN = "ensure-admin-token-0123456789abcd"
SRC_ADMIN_TOKEN = "ensure-src-admin-token-012345678"  # admin on ensure-* only: nothing on other-*
PRODUCER_TOKEN = "ensure-producer-token-0123456789"  # produce on the source queues only
TOKENS = {
    "admin": (ADMIN_TOKEN, '["*"]', '["*"]', '["*"]'),
    "src-admin": (SRC_ADMIN_TOKEN, '["ensure-*"]', "[]", "[]"),
    "producer": (PRODUCER_TOKEN, "[]", '["ensure-*"]', "[]"),
}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    security = tokens_toml((name, *spec) for name, spec in TOKENS.items())
    cluster = Cluster(tmp_path_factory.mktemp("create-repeat"), extra_toml=security)
    with running(cluster, ADMIN_TOKEN):  # the harness's own calls as admin
        yield cluster


def _credentials(c: Cluster, token: str) -> tuple[str, str]:
    r = c.get("/v1/sqs/credentials", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()["access_key_id"], r.json()["secret_access_key"]


def _json(c: Cluster, token: str, node: str = "n1") -> Any:
    return sqs_client(c.url(node), _credentials(c, token), region="us-east-1", retries={"max_attempts": 1})


def _query(c: Cluster, token: str, tmp: Path, node: str = "n1") -> Any:
    credentials = _credentials(c, token)
    return query_sqs_client(c.url(node), tmp, credentials, region="us-east-1", retries={"max_attempts": 1})


def _policy(target: str, count: int | str, *, reversed_keys: bool = False) -> str:
    policy = {"deadLetterTargetArn": ARN + target, "maxReceiveCount": count}
    if reversed_keys:
        policy = dict(reversed(policy.items()))
    return json.dumps(policy, indent=1)


def _code(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as e:
        call()
    code: str = e.value.response["Error"]["Code"]
    return code


def _stored(c: Cluster, name: str) -> dict[str, str]:
    """The topic's attributes, once every node's replica holds the same (with its RedrivePolicy)."""
    seen: list[dict[str, str]] = []

    def settled() -> bool:
        seen[:] = [c.get(f"/v1/topics/{name}", node).json()["attributes"] for node in c.nodes]
        return "sqs.RedrivePolicy" in seen[0] and all(s == seen[0] for s in seen)

    wait_until(settled, 10)
    return seen[0]


def _setup(c: Cluster) -> dict[str, dict[str, str]]:
    """The two dead-letter queues and the two sources set up by the admin; each source's
    attributes as a tool would send them again."""
    admin = _json(c, ADMIN_TOKEN)
    admin.create_queue(QueueName=DLQ)
    admin.create_queue(QueueName=DLQ_FIFO, Attributes={"FifoQueue": "true"})
    wanted = {
        SRC: {
            "VisibilityTimeout": "45",
            "RedrivePolicy": _policy(DLQ, 3),
            "RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"}),
        },
        SRC_FIFO: {
            "FifoQueue": "true",
            "ContentBasedDeduplication": "true",
            "RedrivePolicy": _policy(DLQ_FIFO, 5),
        },
    }
    for name, attributes in wanted.items():
        admin.create_queue(QueueName=name, Attributes=attributes)
    return wanted


def test_create_queue_repeating_the_current_redrive_policy_needs_no_right_on_the_dead_letter_queue(
    c: Cluster, tmp_path: Path
) -> None:
    wanted = _setup(c)
    before = {name: _stored(c, name) for name in wanted}
    time.sleep(1.1)  # LastModifiedTimestamp counts seconds: a write from here on would move it
    src_admin = {
        "json": _json(c, SRC_ADMIN_TOKEN, "n2"),
        "query": _query(c, SRC_ADMIN_TOKEN, tmp_path, "n3"),
    }
    for wire, sqs in src_admin.items():
        for name, attributes in wanted.items():
            current = json.loads(attributes["RedrivePolicy"])
            target, count = current["deadLetterTargetArn"].rsplit(":", 1)[-1], current["maxReceiveCount"]
            for policy in (attributes["RedrivePolicy"], _policy(target, str(count), reversed_keys=True)):
                url = sqs.create_queue(QueueName=name, Attributes={**attributes, "RedrivePolicy": policy})
                assert url["QueueUrl"].endswith(f"/000000000000/{name}"), (wire, url)
            # What GetQueueAttributes shows it, written back whole (a Terraform-like ensure).
            shown = sqs.get_queue_attributes(QueueUrl=url["QueueUrl"], AttributeNames=["All"])["Attributes"]
            writable = {
                k: v
                for k, v in shown.items()
                if k not in ("QueueArn", "CreatedTimestamp", "LastModifiedTimestamp")
                and not k.startswith("Approximate")
            }
            assert writable["RedrivePolicy"] == before[name]["sqs.RedrivePolicy"], (wire, writable)
            sqs.create_queue(QueueName=name, Attributes=writable)
    # Nothing written: not even the modification time.
    assert {name: _stored(c, name) for name in wanted} == before


def test_create_queue_with_another_redrive_policy_is_still_refused(c: Cluster, tmp_path: Path) -> None:
    wanted = _setup(c)
    before = {name: _stored(c, name) for name in wanted}
    topics = {t["name"] for t in c.get("/v1/topics").json()["topics"]}
    src_admin, producer = _json(c, SRC_ADMIN_TOKEN, "n2"), _json(c, PRODUCER_TOKEN, "n3")
    query = _query(c, SRC_ADMIN_TOKEN, tmp_path)
    attributes = wanted[SRC]
    for sqs in (src_admin, query):
        for other in (
            _policy(DLQ, 4),  # another count
            _policy(DLQ_FIFO, 3),  # another dead-letter queue
            _policy("other-no-such-queue", 3),  # one that does not exist: the right first
        ):
            changed = {**attributes, "RedrivePolicy": other}
            assert (
                _code(lambda a=changed, s=sqs: s.create_queue(QueueName=SRC, Attributes=a)) == "AccessDenied"
            )
        # A new queue naming the dead-letter queue: refused, not created.
        new = {"RedrivePolicy": attributes["RedrivePolicy"]}
        assert (
            _code(lambda s=sqs, a=new: s.create_queue(QueueName="ensure-new", Attributes=a)) == "AccessDenied"
        )
        # The same policy with another attribute changed: the queue exists otherwise (AWS's answer).
        other_timeout = {**attributes, "VisibilityTimeout": "46"}
        assert _code(lambda s=sqs, a=other_timeout: s.create_queue(QueueName=SRC, Attributes=a)) == (
            "QueueAlreadyExists"
        )
    # Without admin on the queue: refused as before, its policy repeated or not.
    for name, repeated in wanted.items():
        assert _code(lambda n=name, a=repeated: producer.create_queue(QueueName=n, Attributes=a)) == (
            "AccessDenied"
        )
    assert {name: _stored(c, name) for name in wanted} == before
    assert {t["name"] for t in c.get("/v1/topics").json()["topics"]} == topics
