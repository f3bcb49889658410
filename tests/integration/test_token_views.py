"""What a token can SEE, on a real 3-node cluster with API tokens (docs/security.md, "What a token
can see"): no answer names a topic the token has no right on, and only a cluster admin sees the
nodes' Raft addresses.

- ``GET /v1/cluster``: a produce-only token gets what a client routes by (node ids, HTTP
  addresses, reachability, group leaders) and no Raft address; the Python client routes with it.
- An SQS queue's attributes name other queues (RedrivePolicy, RedriveAllowPolicy, its move tasks'
  destinations): ``GET /v1/topics/{topic}``, ``GET /v1/topics``, GetQueueAttributes and
  ListMessageMoveTasks show each such name only to a token with some right on it, but a queue's
  two policies whole to that queue's admin (its own settings).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from raftmq.client import Producer

from .harness import Cluster, running, tokens_toml, wait_until
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(240)

ARN = "arn:aws:sqs:us-east-1:000000000000:"  # the cluster's default [sqs] region
SRC, DLQ, DEST = "views-src", "views-dlq", "hidden-dest"
ADMIN_TOKEN = "views-admin-token-0123456789abcd"
PRODUCER_TOKEN = "views-producer-token-0123456789ab"  # produce on orders only
DLQ_TOKEN = "views-dlq-token-0123456789abcdef"  # consume on the dead-letter queue only
SRC_TOKEN = "views-src-token-0123456789abcdef"  # produce on the source queue only
BOTH_TOKEN = "views-both-token-0123456789abcde"  # consume on every views-* queue
DLQ_ADMIN_TOKEN = "views-dlq-admin-token-0123456789"  # admin on the dead-letter queue only
SRC_ADMIN_TOKEN = "views-src-admin-token-0123456789"  # admin on the source queue only
REPLICA_FIELDS = {"node_id", "is_leader", "term", "commit_index", "applied_index", "has_quorum"}
GLOB_TOKEN = "views-glob-token-0123456789abcdef"  # every right on payments.*, none on payments
OTHER_GLOB_TOKEN = "views-other-glob-token-0123456789"  # every right on orders.*: neither name nor source
TOKENS = {
    "admin": (ADMIN_TOKEN, '["*"]', '["*"]', '["*"]'),
    "producer": (PRODUCER_TOKEN, "[]", '["orders"]', "[]"),
    "dlq-reader": (DLQ_TOKEN, "[]", "[]", f'["{DLQ}"]'),
    "src-producer": (SRC_TOKEN, "[]", f'["{SRC}"]', "[]"),
    "both": (BOTH_TOKEN, "[]", "[]", '["views-*"]'),
    "dlq-admin": (DLQ_ADMIN_TOKEN, f'["{DLQ}"]', "[]", "[]"),
    "src-admin": (SRC_ADMIN_TOKEN, f'["{SRC}"]', "[]", "[]"),
    "payments-glob": (GLOB_TOKEN, '["payments.*"]', '["payments.*"]', '["payments.*"]'),
    "orders-glob": (OTHER_GLOB_TOKEN, '["orders.*"]', '["orders.*"]', '["orders.*"]'),
}


SCRAPER_TOKEN = "views-scraper-token-0123456789abc"  # metrics = true, no permission on any topic
SCRAPER_TOML = f'[[security.tokens]]\nname = "scraper"\ntoken = "{SCRAPER_TOKEN}"\nmetrics = true\n'


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    security = tokens_toml((name, *spec) for name, spec in TOKENS.items()) + SCRAPER_TOML
    cluster = Cluster(tmp_path_factory.mktemp("token-views"), extra_toml=security)
    with running(cluster, ADMIN_TOKEN):  # the harness's own calls as admin
        yield cluster


def _sqs(c: Cluster, token: str) -> Any:
    r = c.get("/v1/sqs/credentials", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    body = r.json()
    credentials = (body["access_key_id"], body["secret_access_key"])
    return sqs_client(c.url(), credentials, region="us-east-1", retries={"max_attempts": 1})


def test_a_token_without_cluster_admin_sees_no_raft_address(c: Cluster) -> None:
    raft_ports = [str(n.raft_base) for n in c.nodes.values()]
    admin = c.get("/v1/cluster").json()
    assert {n["raft"] for n in admin["nodes"]} == {f"127.0.0.1:{p}" for p in raft_ports}
    for node in c.nodes:
        r = c.call_as(PRODUCER_TOKEN, "GET", "/v1/cluster", node)
        assert r.status_code == 200, r.text
        view = r.json()
        assert [(n["id"], n["http"]) for n in view["nodes"]] == [(n["id"], n["http"]) for n in admin["nodes"]]
        assert all(set(n) == {"id", "http", "reachable"} for n in view["nodes"]), view["nodes"]
        for g in view["groups"]:
            assert set(g) == {"group_id", "leader", "term", "replicas", "placement"}, g
            assert all(set(replica) <= REPLICA_FIELDS for replica in g["replicas"]), g
        for port in raft_ports:  # no Raft address anywhere (the members, term rises' peers...)
            assert f":{port}" not in r.text, r.text
    # The client routes with what it is shown.
    c.post("/v1/topics", {"name": "orders", "queues": 3})
    with Producer(c.url("n2"), token=PRODUCER_TOKEN) as producer:
        sent = [producer.send("orders", f"m{q}", queue=q) for q in range(3)]
        assert [f.result(30).queue for f in sent] == [0, 1, 2]
    assert sum(len(c.fetch_all("orders", q)) for q in range(3)) == 3


ALLOW = {"redrivePermission": "byQueue", "sourceQueueArns": [ARN + SRC, ARN + DEST]}  # DLQ's


def _setup_queues(c: Cluster) -> None:
    """SRC sends its dead letters to DLQ, which lets SRC alone do so; an admin's move task moved
    DLQ's messages to DEST, which neither DLQ_TOKEN nor SRC_TOKEN may touch."""
    admin = _sqs(c, ADMIN_TOKEN)
    admin.create_queue(QueueName=DEST)
    dlq_url = admin.create_queue(QueueName=DLQ)["QueueUrl"]
    admin.create_queue(
        QueueName=SRC,
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": ARN + DLQ, "maxReceiveCount": 1})},
    )
    admin.set_queue_attributes(QueueUrl=dlq_url, Attributes={"RedriveAllowPolicy": json.dumps(ALLOW)})
    admin.send_message(QueueUrl=dlq_url, MessageBody="dead")
    admin.start_message_move_task(SourceArn=ARN + DLQ, DestinationArn=ARN + DEST)
    wait_until(
        lambda: admin.list_message_move_tasks(SourceArn=ARN + DLQ)["Results"][0]["Status"] == "COMPLETED",
        60,
        0.3,
        "the move task's end",
    )


def test_queue_attributes_name_only_queues_the_token_has_a_right_on(c: Cluster) -> None:
    _setup_queues(c)
    # An admin sees every name, on every road.
    admin = c.get(f"/v1/topics/{DLQ}").json()["attributes"]
    assert DEST in admin["sqs.MessageMoveTasks"] and DEST in admin["sqs.RedriveAllowPolicy"], admin
    # The dead-letter queue's consumer: its own queue's move tasks and allow policy, without DEST.
    for node in c.nodes:
        r = c.call_as(DLQ_TOKEN, "GET", f"/v1/topics/{DLQ}", node)
        assert r.status_code == 200, r.text
        assert DEST not in r.text and SRC not in r.text, r.text
        listed = c.call_as(DLQ_TOKEN, "GET", "/v1/topics", node)
        assert [t["name"] for t in listed.json()["topics"]] == [DLQ]
        assert DEST not in listed.text and SRC not in listed.text, listed.text
    dlq_reader = _sqs(c, DLQ_TOKEN)
    attrs = dlq_reader.get_queue_attributes(QueueUrl=c.url() + f"/000000000000/{DLQ}", AttributeNames=["All"])
    assert DEST not in json.dumps(attrs) and SRC not in json.dumps(attrs), attrs
    tasks = dlq_reader.list_message_move_tasks(SourceArn=ARN + DLQ, MaxResults=10)["Results"]
    assert tasks == [], tasks  # the one task moved to DEST
    sources = dlq_reader.list_dead_letter_source_queues(QueueUrl=c.url() + f"/000000000000/{DLQ}")
    assert sources["queueUrls"] == [], sources
    # A task back to the sources it may not send to is refused without naming them.
    with pytest.raises(ClientError) as refused:
        dlq_reader.start_message_move_task(SourceArn=ARN + DLQ)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    assert SRC not in str(refused.value.response), refused.value.response
    # The source queue's producer: no RedrivePolicy naming DLQ.
    src = _sqs(c, SRC_TOKEN)
    got = src.get_queue_attributes(QueueUrl=c.url() + f"/000000000000/{SRC}", AttributeNames=["All"])
    assert "RedrivePolicy" not in got["Attributes"] and DLQ not in json.dumps(got), got
    r = c.call_as(SRC_TOKEN, "GET", f"/v1/topics/{SRC}")
    assert r.status_code == 200 and DLQ not in r.text, r.text
    # A token with a right on SRC and DLQ but not DEST: the names it has a right on, not DEST.
    both = _sqs(c, BOTH_TOKEN)
    got = both.get_queue_attributes(QueueUrl=c.url() + f"/000000000000/{DLQ}", AttributeNames=["All"])
    allowed = json.loads(got["Attributes"]["RedriveAllowPolicy"])
    assert allowed == {"redrivePermission": "byQueue", "sourceQueueArns": [ARN + SRC]}, allowed
    got = both.get_queue_attributes(QueueUrl=c.url() + f"/000000000000/{SRC}", AttributeNames=["All"])
    assert json.loads(got["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"] == ARN + DLQ
    _the_dead_letter_queue_s_admin_reads_its_allow_policy_whole(c)
    _the_source_queue_s_admin_reads_its_redrive_policy_as_written(c)
    _the_source_queue_s_admin_writes_back_what_it_read(c)


def _the_dead_letter_queue_s_admin_reads_its_allow_policy_whole(c: Cluster) -> None:
    """Its allow policy is the admin's own text, which tools (Terraform) read and write back: shown
    filtered, a write-back dropped the sources hidden from it (review finding). The move task to
    DEST, not its text, stays hidden."""
    dlq_admin, url = _sqs(c, DLQ_ADMIN_TOKEN), c.url() + f"/000000000000/{DLQ}"
    got = dlq_admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert json.loads(got["RedriveAllowPolicy"]) == ALLOW, got
    for node in c.nodes:
        r = c.call_as(DLQ_ADMIN_TOKEN, "GET", f"/v1/topics/{DLQ}", node)
        assert json.loads(r.json()["attributes"]["sqs.RedriveAllowPolicy"]) == ALLOW, r.text
        assert DEST not in r.json()["attributes"]["sqs.MessageMoveTasks"], r.text
        listed = c.call_as(DLQ_ADMIN_TOKEN, "GET", "/v1/topics", node).json()["topics"]
        assert [json.loads(t["attributes"]["sqs.RedriveAllowPolicy"]) for t in listed] == [ALLOW], listed
    dlq_admin.set_queue_attributes(QueueUrl=url, Attributes={"RedriveAllowPolicy": got["RedriveAllowPolicy"]})
    kept = c.get(f"/v1/topics/{DLQ}").json()["attributes"]["sqs.RedriveAllowPolicy"]
    assert json.loads(kept) == ALLOW, kept


def _the_source_queue_s_admin_reads_its_redrive_policy_as_written(c: Cluster) -> None:
    """The RedrivePolicy says where the source's own messages go: hidden from its admin (no right
    on DLQ), the queue looked as if it had none while its messages were moved away. Its admin sees
    it as written on every road; setting another still needs a right on DLQ (writing it back
    unchanged does not: :func:`_the_source_queue_s_admin_writes_back_what_it_read`)."""
    src_admin, url = _sqs(c, SRC_ADMIN_TOKEN), c.url() + f"/000000000000/{SRC}"
    stored = c.get(f"/v1/topics/{SRC}").json()["attributes"]["sqs.RedrivePolicy"]
    got = src_admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got.get("RedrivePolicy") == stored, got
    assert json.loads(stored) == {"deadLetterTargetArn": ARN + DLQ, "maxReceiveCount": 1}, stored
    for node in c.nodes:
        r = c.call_as(SRC_ADMIN_TOKEN, "GET", f"/v1/topics/{SRC}", node)
        assert r.json()["attributes"]["sqs.RedrivePolicy"] == stored, r.text
        listed = c.call_as(SRC_ADMIN_TOKEN, "GET", "/v1/topics", node).json()["topics"]
        assert [t["attributes"]["sqs.RedrivePolicy"] for t in listed] == [stored], listed
    # Still hidden from a token without admin on SRC and without a right on DLQ.
    src = _sqs(c, SRC_TOKEN)
    assert "RedrivePolicy" not in src.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


READ_ONLY = {"QueueArn", "CreatedTimestamp", "LastModifiedTimestamp"}  # and Approximate*


def _the_source_queue_s_admin_writes_back_what_it_read(c: Cluster) -> None:
    """A tool (Terraform) reads every attribute of the queue and writes them all back with its
    change: the RedrivePolicy among them is the queue's current one, which changes nothing and
    needs no right on DLQ (the whole write was AccessDenied). However written (keys in another
    order, spaces, the count as a string) the same policy is no change; another count or another
    dead-letter queue still needs that right, and its refusal changes nothing. A dead-letter queue
    that does not exist is refused for the right too (AccessDenied), before it is looked up: an
    answer saying it does not exist would tell of queues the token has no right on."""
    src_admin, url = _sqs(c, SRC_ADMIN_TOKEN), c.url("n2") + f"/000000000000/{SRC}"
    stored = c.get(f"/v1/topics/{SRC}").json()["attributes"]["sqs.RedrivePolicy"]

    def attributes() -> dict[str, str]:
        got = src_admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return dict(got)

    writable = {
        k: v for k, v in attributes().items() if k not in READ_ONLY and not k.startswith("Approximate")
    }
    assert writable["RedrivePolicy"] == stored, writable
    src_admin.set_queue_attributes(QueueUrl=url, Attributes={**writable, "VisibilityTimeout": "45"})
    assert attributes()["VisibilityTimeout"] == "45"
    same = json.dumps({"maxReceiveCount": "1", "deadLetterTargetArn": ARN + DLQ}, indent=2)
    src_admin.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": same})
    assert c.get(f"/v1/topics/{SRC}").json()["attributes"]["sqs.RedrivePolicy"] == stored
    before = attributes()
    for other in (
        {"deadLetterTargetArn": ARN + DLQ, "maxReceiveCount": 2},
        {"deadLetterTargetArn": ARN + DEST, "maxReceiveCount": 1},
        {"deadLetterTargetArn": ARN + "views-no-such-dlq", "maxReceiveCount": 1},  # the right first
    ):
        with pytest.raises(ClientError) as refused:
            src_admin.set_queue_attributes(
                QueueUrl=url, Attributes={"RedrivePolicy": json.dumps(other), "VisibilityTimeout": "50"}
            )
        assert refused.value.response["Error"]["Code"] == "AccessDenied", refused.value.response
    assert attributes() == before
    assert c.get(f"/v1/topics/{SRC}").json()["attributes"]["sqs.RedrivePolicy"] == stored


def _metric_lines(c: Cluster, token: str) -> list[str]:
    """Every sample line of every node's ``/metrics`` read with ``token``."""
    lines = []
    for node in c.nodes:
        r = c.call_as(token, "GET", "/metrics", node)
        assert r.status_code == 200, r.text
        lines += [line for line in r.text.splitlines() if not line.startswith("#")]
    return lines


def test_metrics_name_only_the_token_s_topics_and_no_raft_address(c: Cluster) -> None:
    c.post("/v1/topics", {"name": "orders", "queues": 3})
    c.post("/v1/topics", {"name": "elsewhere", "queues": 3})
    for topic in ("orders", "elsewhere"):
        assert c.produce(topic, [{"value": "v", "queue": q} for q in range(3)]).status_code == 200
    every = wait_until(
        lambda: (
            (lines := _metric_lines(c, ADMIN_TOKEN))
            and any('topic="elsewhere"' in x for x in lines)
            and lines
        ),
        20,
        0.5,
        "the queues' metrics",
    )
    assert any('peer="127.0.0.1:' in line for line in every)  # term rises: Raft addresses
    scraped = _metric_lines(c, SCRAPER_TOKEN)  # metrics = true: every metric, as an admin
    assert any('topic="elsewhere"' in line for line in scraped) and any("peer=" in line for line in scraped)
    shown = _metric_lines(c, PRODUCER_TOKEN)
    assert any('topic="orders"' in line for line in shown), shown
    assert any(line.startswith("raftmq_raft_term{") for line in shown)  # the node's own metrics stay
    topics = {part.split('"')[1] for line in shown for part in line.split("topic=")[1:]}
    assert topics == {"orders"}, topics
    assert not [line for line in shown if "peer=" in line]


def test_a_dead_letter_topic_one_may_not_see_answers_as_a_missing_name_does(c: Cluster) -> None:
    """``payments.*`` matches ``payments.billing.dlq`` but has no right on ``payments``, its source;
    ``orders.*`` matches neither: every road answers that name exactly as a name no topic has
    (``payments.nothing.dlq``), the name asked for aside, so neither token can tell which groups of
    ``payments`` have dead letters (before, the 403 named ``payments`` for the existing one and the
    name itself for the missing one to ``orders.*``)."""
    c.post("/v1/topics", {"name": "payments", "queues": 1})
    settings = {"max_deliveries": 2, "backoff_ms": [100]}
    r = c.session.put(c.url() + "/v1/topics/payments/subscriptions/billing", json=settings, timeout=30)
    assert r.status_code == 200, r.text
    assert c.get("/v1/topics/payments.billing.dlq").status_code == 200
    roads = [
        ("GET", "/v1/topics/{t}", None),
        ("GET", "/v1/topics/{t}/queues/0/messages", None),
        ("POST", "/v1/topics/{t}/messages", {"messages": [{"value": "x"}]}),
        ("POST", "/v1/topics/{t}/subscriptions/g/receive", {"wait_ms": 0}),
        ("GET", "/v1/topics/{t}/groups", None),
        ("DELETE", "/v1/topics/{t}", None),
    ]
    for token, node in itertools.product((GLOB_TOKEN, OTHER_GLOB_TOKEN), c.nodes):
        for method, path, body in roads:
            existing = c.call_as(token, method, path.format(t="payments.billing.dlq"), node, json=body)
            missing = c.call_as(token, method, path.format(t="payments.nothing.dlq"), node, json=body)
            assert existing.status_code == 403, (path, existing.text)
            as_existing = json.loads(missing.text.replace("payments.nothing.dlq", "payments.billing.dlq"))
            assert (missing.status_code, as_existing) == (existing.status_code, existing.json()), path
    assert c.get("/v1/topics/payments.billing.dlq").status_code == 200  # nothing deleted
