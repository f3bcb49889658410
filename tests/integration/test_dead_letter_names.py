"""Issue 19, items 1-2, as a client would probe them, on a real 3-node cluster with API tokens:
a dotted consumer-group name reaches no other topic's dead letters (list, redrive, the CLI, the
dead-letter write), and consume rights do not grow the cluster (no dead-letter topic for an
invented group, idle invented groups leave /metrics, caps per topic and per token). A dead-letter
topic's permissions go by its source's name, on every route (``ledger.*`` gets nothing of ledger's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import Cluster, running, tokens_toml, wait_until

pytestmark = pytest.mark.timeout(300)

ADMIN = "admin-token-Rt5Yh8Jk2Lp4Mn7Bv"
OWNER = "owner-token-Zx3Cv6Bn9Mq2Wd5Ef"  # consume + produce on payments.eu (the victim)
PRODUCER = "payments-rw-token-Gh7Jk3Lq9Pz2"  # consume + produce on payments only
CONSUMER = "payments-ro-token-Tf4Yu8Io1Pa6"  # consume on payments only
INVENTOR = "inventor-token-Sd2Fg5Hj8Kl3Zx"  # consume on invented
CAPPER = "capper-token-Qw9Er4Ty7Ui2Op5A"  # consume on capped
CAPPER2 = "capper2-token-Mn6Bv3Cx8Zl1Kj4"  # consume on capped
GLOB = "ledger-glob-token-Vb8Nm2Qa5Ws7"  # everything on ledger.* (ledger.eu, ...), nothing on ledger
TOKENS = [
    ("admin", ADMIN, '["*"]', '["*"]', '["*"]'),
    ("owner", OWNER, "[]", '["payments.eu"]', '["payments.eu"]'),
    ("payments-rw", PRODUCER, "[]", '["payments"]', '["payments"]'),
    ("payments-ro", CONSUMER, "[]", "[]", '["payments"]'),
    ("inventor", INVENTOR, "[]", "[]", '["invented"]'),
    ("capper", CAPPER, "[]", "[]", '["capped"]'),
    ("capper2", CAPPER2, "[]", "[]", '["capped"]'),
    ("ledger-glob", GLOB, '["ledger.*"]', '["ledger.*"]', '["ledger.*"]'),
]
SECURITY = tokens_toml(TOKENS)
# subscription_idle_ms 8 s (the least with max_visibility_ms 8 s): the expiry test waits for it; the
# other tests make and use their groups within 4 s (the caps test its 30 in 0.1 s).
CONFIG = (
    "[delivery]\nmax_deliveries = 2\nbackoff_ms = [100]\ntick_ms = 100\n"
    "[limits]\nsubscription_idle_ms = 8000\nmax_visibility_ms = 8000\ndefault_visibility_ms = 1000\n"
    "max_groups_per_topic = 30\nmax_groups_per_token = 25\n"
    "[raft]\nretention_check_ms = 500\n" + SECURITY
)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # One queue group: every topic has the same placement, as in the probe.
    with running(
        Cluster(tmp_path_factory.mktemp("dead-letter-names"), queue_groups=1, extra_toml=CONFIG), ADMIN
    ) as cluster:
        yield cluster


def sub(topic: str, group: str, action: str = "") -> str:
    return f"/v1/topics/{topic}/subscriptions/{group}" + (f"/{action}" if action else "")


def ensure_topic(c: Cluster, name: str) -> None:
    r = c.post("/v1/topics", {"name": name, "queues": 1})
    assert r.status_code in (201, 409), r.text


def topic_names(c: Cluster) -> set[str]:
    return {t["name"] for t in c.get("/v1/topics").json()["topics"]}


def receive_one(c: Cluster, token: str, topic: str, group: str) -> dict[str, Any]:
    r = c.call_as(token, "POST", sub(topic, group, "receive"), json={"wait_ms": 10_000, "max": 1})
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    return dict(m)


def dlq_high(c: Cluster, name: str) -> int:
    r = c.get(f"/v1/topics/{name}")
    assert r.status_code == 200, r.text
    return int(r.json()["queues"][0]["high_offset"])


@pytest.fixture(scope="module")
def owners_dead_letter(c: Cluster) -> str:
    """payments.eu's group billing, configured by an admin, with one dead letter "secret"."""
    ensure_topic(c, "payments")
    ensure_topic(c, "payments.eu")
    r = c.session.put(c.url() + sub("payments.eu", "billing"), json={"max_deliveries": 1}, timeout=30)
    assert r.status_code == 200 and r.json()["dead_letter_topic"] == "payments.eu.billing.dlq", r.text
    assert c.produce("payments.eu", [{"value": "secret"}]).status_code == 200
    m = receive_one(c, OWNER, "payments.eu", "billing")
    r = c.call_as(OWNER, "POST", sub("payments.eu", "billing", "nack"), json={"receipts": [m["receipt"]]})
    assert r.json()["results"][0].get("dead_lettered") is True, r.text
    return "payments.eu.billing.dlq"


def owners_view(c: Cluster) -> list[str]:
    r = c.call_as(OWNER, "GET", sub("payments.eu", "billing", "dlq"))
    assert r.status_code == 200, r.text
    return [m["value"] for m in r.json()["messages"]]


def test_a_dotted_group_neither_lists_nor_redrives_another_topics_dead_letters(
    c: Cluster, owners_dead_letter: str
) -> None:
    assert owners_view(c) == ["secret"]
    for node in c.nodes:  # the entry node and forwarding nodes alike
        r = c.call_as(PRODUCER, "GET", sub("payments", "eu.billing", "dlq"), node)
        assert r.status_code == 200, r.text
        assert r.json()["messages"] == [] and r.json()["queues"] == [], r.text
        r = c.call_as(PRODUCER, "POST", sub("payments", "eu.billing", "dlq/redrive"), node, json={})
        assert r.status_code == 200 and r.json()["redriven"] == 0, r.text
    assert owners_view(c) == ["secret"]  # the owner's view is intact
    r = c.call_as(PRODUCER, "POST", "/v1/topics/payments/messages", json={"messages": [{"value": "x"}]})
    assert r.status_code == 200, r.text
    r = c.call_as(PRODUCER, "GET", "/v1/topics/payments/queues/0/messages?offset=0&max=100")
    assert "secret" not in [m["value"] for m in r.json()["messages"]]  # nothing moved into payments
    # The command line goes through the same routes.
    env = {k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"}
    env.update(RAFTMQ_URL=" ".join(c.url(n) for n in c.nodes), RAFTMQ_TOKEN=PRODUCER)
    for args in (
        ["list", "payments", "--group", "eu.billing"],
        ["redrive", "payments", "--group", "eu.billing"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "raftmq.cluster.cli.main", "dlq", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert "secret" not in proc.stdout and '"redriven":1' not in proc.stdout, proc.stdout
    assert owners_view(c) == ["secret"]


def test_nacks_under_a_dotted_group_never_write_into_another_topics_dead_letter_topic(
    c: Cluster, owners_dead_letter: str
) -> None:
    before = dlq_high(c, owners_dead_letter)
    assert c.produce("payments", [{"value": "forged"}]).status_code == 200
    results: list[dict[str, Any]] = []
    for _ in range(2):  # max_deliveries = 2: the second nack spends the messages
        r = c.call_as(CONSUMER, "POST", sub("payments", "eu.billing", "receive"), json={"wait_ms": 5000})
        receipts = [m["receipt"] for m in r.json()["messages"]]
        assert receipts, r.text
        r = c.call_as(
            CONSUMER,
            "POST",
            sub("payments", "eu.billing", "nack"),
            json={"receipts": receipts, "delay_ms": 0},
        )
        assert r.status_code == 200, r.text
        results = r.json()["results"]
    time.sleep(3)  # parked messages are looked at again after 1 s; the leader records no topic
    assert dlq_high(c, owners_dead_letter) == before
    assert all(x.get("parked") is True and "dead_lettered" not in x for x in results), results
    r = c.call_as(CONSUMER, "POST", sub("payments", "eu.billing", "receive"), json={"wait_ms": 500})
    assert r.status_code == 200 and r.json()["messages"] == [], r.text  # parked: not handed out again
    r = c.call_as(OWNER, "POST", sub("payments.eu", "billing", "dlq/redrive"), json={})
    assert r.status_code == 200, r.text
    r = c.call_as(OWNER, "GET", "/v1/topics/payments.eu/queues/0/messages?offset=0&max=100")
    assert "forged" not in [m["value"] for m in r.json()["messages"]]
    assert [m["value"] for m in r.json()["messages"]].count("secret") == 2  # the original and its redrive


def test_consume_rights_make_no_dead_letter_topic_and_invented_groups_expire_from_metrics(c: Cluster) -> None:
    ensure_topic(c, "invented")
    assert c.produce("invented", [{"value": "v"}]).status_code == 200
    before = topic_names(c)
    # 20 receives under 20 new group names, and receive-and-nack rounds until a dead letter.
    for i in range(20):
        r = c.call_as(
            INVENTOR, "POST", sub("invented", f"made-up-{i}", "receive"), list(c.nodes)[i % 3], json={}
        )
        assert r.status_code == 200, r.text

    def groups_in_metrics() -> set[str]:
        text = "".join(c.get("/metrics", node).text for node in c.nodes)
        return {
            line.split('group="', 1)[1].split('"', 1)[0]
            for line in text.splitlines()
            if line.startswith("raftmq_consumer_lag_messages{") and 'topic="invented"' in line
        }

    assert len(groups_in_metrics()) == 20
    # A queue lock under an invented group: its record goes with the group's subscription.
    locks = "/v1/topics/invented/queues/0/locks/locker"
    r = c.call_as(INVENTOR, "POST", locks, json={"consumer": "a", "lease_ms": 1000})
    assert r.status_code == 200 and r.json()["epoch"] == 1, r.text
    assert c.call_as(INVENTOR, "DELETE", locks + "?consumer=a&epoch=1").json() == {"released": True}
    for _ in range(2):
        m = receive_one(c, INVENTOR, "invented", "spender")
        body = {"receipts": [m["receipt"]], "delay_ms": 0}
        r = c.call_as(INVENTOR, "POST", sub("invented", "spender", "nack"), json=body)
    time.sleep(2)
    assert topic_names(c) == before  # no dead-letter topic for an invented group
    assert r.json()["results"][0].get("parked") is True, r.text
    wait_until(lambda: not groups_in_metrics(), 60, interval_s=1, what="the idle invented groups to expire")
    r = c.get("/v1/topics/invented/groups")
    assert r.status_code == 200 and r.json()["groups"] == [], r.text
    r = c.call_as(INVENTOR, "POST", locks, json={"consumer": "b", "lease_ms": 1000})
    assert r.status_code == 200 and r.json()["epoch"] == 1, r.text  # a new record, not the kept one's 2


def test_new_groups_over_the_per_token_and_per_topic_caps_are_refused_with_too_many_groups(
    c: Cluster,
) -> None:
    ensure_topic(c, "capped")
    for i in range(25):
        r = c.call_as(CAPPER, "POST", sub("capped", f"c1-{i}", "receive"), json={})
        assert r.status_code == 200, r.text
    r = c.call_as(CAPPER, "POST", sub("capped", "c1-over", "receive"), json={})
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    assert "max_groups_per_token" in r.json()["error"]["message"]
    assert c.call_as(CAPPER, "POST", sub("capped", "c1-0", "receive"), json={}).status_code == 200  # known
    for i in range(5):
        r = c.call_as(CAPPER2, "POST", sub("capped", f"c2-{i}", "receive"), json={})
        assert r.status_code == 200, r.text
    r = c.call_as(CAPPER2, "POST", sub("capped", "c2-over", "receive"), json={})
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    assert "max_groups_per_topic" in r.json()["error"]["message"]
    # The push stream is refused the same way, before the upgrade.
    r = c.call_as(CAPPER2, "GET", sub("capped", "c2-stream", "stream"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    # So is a queue lock under a new group: a lock is kept under its group's subscription.
    lock = {"consumer": "c", "lease_ms": 1000}
    r = c.call_as(CAPPER2, "POST", "/v1/topics/capped/queues/0/locks/c2-lock", json=lock)
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    assert c.call_as(CAPPER2, "POST", "/v1/topics/capped/queues/0/locks/c2-0", json=lock).status_code == 200
    # An admin configures a group whatever the caps.
    r = c.session.put(c.url() + sub("capped", "configured"), json={}, timeout=30)
    assert r.status_code == 200, r.text


def dead_letter_one(c: Cluster, topic: str, value: str) -> None:
    """``value`` into ``topic``'s dead-letter topic of group billing (configured by the admin)."""
    ensure_topic(c, topic)
    r = c.session.put(c.url() + sub(topic, "billing"), json={"max_deliveries": 1}, timeout=30)
    assert r.status_code == 200 and r.json()["dead_letter_topic"] == f"{topic}.billing.dlq", r.text
    assert c.produce(topic, [{"value": value}]).status_code == 200
    m = receive_one(c, ADMIN, topic, "billing")
    r = c.call_as(ADMIN, "POST", sub(topic, "billing", "nack"), json={"receipts": [m["receipt"]]})
    assert r.json()["results"][0].get("dead_lettered") is True, r.text


def test_a_dead_letter_topic_is_guarded_by_its_sources_name_not_its_own(c: Cluster) -> None:
    dead_letter_one(c, "ledger", "ledger-secret")  # ledger.billing.dlq: ledger.* matches its name
    dead_letter_one(c, "ledger.eu", "eu-secret")  # ledger.eu.billing.dlq: ledger.* matches its source
    dlq = "/v1/topics/ledger.billing.dlq"
    for node in c.nodes:  # the entry node and forwarding nodes alike
        refused = [
            c.call_as(GLOB, "GET", dlq, node),
            c.call_as(GLOB, "GET", dlq + "/queues/0/messages?offset=0&max=100", node),
            c.call_as(
                GLOB,
                "GET",
                dlq + "/queues/0/messages?offset=0",
                node,
                headers={"Accept": "application/vnd.raftmq.batch"},
            ),
            c.call_as(GLOB, "GET", dlq + "/segments", node),
            c.call_as(GLOB, "POST", dlq + "/messages", node, json={"messages": [{"value": "injected"}]}),
            c.call_as(
                GLOB,
                "POST",
                dlq + "/messages",
                node,
                data=b"\x00" * 16,
                headers={"Content-Type": "application/vnd.raftmq.batch"},
            ),
            c.call_as(GLOB, "POST", dlq + "/subscriptions/g/receive", node, json={"wait_ms": 0}),
            c.call_as(GLOB, "GET", dlq + "/subscriptions/g/stream", node),
            c.call_as(GLOB, "GET", dlq + "/groups", node),
            c.call_as(GLOB, "GET", "/v1/groups/g/offsets?topic=ledger.billing.dlq", node),
            c.call_as(
                GLOB,
                "PUT",
                "/v1/groups/g/offsets",
                node,
                json={"topic": "ledger.billing.dlq", "offsets": {"0": 0}},
            ),
            c.call_as(GLOB, "PATCH", dlq, node, json={"attributes": {"a": "b"}}),
            c.call_as(GLOB, "DELETE", dlq, node),
        ]
        for r in refused:
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (r.request.url, r.text)
    assert dlq_high(c, "ledger.billing.dlq") == 1  # nothing injected, the topic still there
    names = {t["name"] for t in c.call_as(GLOB, "GET", "/v1/topics").json()["topics"]}
    assert "ledger.billing.dlq" not in names and {"ledger.eu", "ledger.eu.billing.dlq"} <= names, names
    # The common case keeps working: ledger.* reads ledger.eu's dead letters.
    r = c.call_as(GLOB, "GET", "/v1/topics/ledger.eu.billing.dlq/queues/0/messages?offset=0&max=100")
    assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == ["eu-secret"], r.text
    # The source's own grant reaches its dead-letter topic: payments.eu's owner reads payments.eu.billing.dlq.
    ensure_topic(c, "payments.eu")
    r = c.session.put(c.url() + sub("payments.eu", "billing"), json={"max_deliveries": 1}, timeout=30)
    assert r.status_code == 200, r.text
    r = c.call_as(OWNER, "GET", "/v1/topics/payments.eu.billing.dlq")
    assert r.status_code == 200, r.text


def test_a_token_cannot_create_a_topic_that_would_take_a_dead_letter_name_of_a_topic_it_does_not_administer(
    c: Cluster,
) -> None:
    ensure_topic(c, "ledger")
    ensure_topic(c, "ledger.eu")
    for name in ("ledger.audit.dlq", "ledger.eu.audit.dlq"):  # ledger could own both (groups audit, eu.audit)
        r = c.call_as(GLOB, "POST", "/v1/topics", json={"name": name, "queues": 1})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    assert not {"ledger.audit.dlq", "ledger.eu.audit.dlq"} & topic_names(c)
    r = c.call_as(GLOB, "POST", "/v1/topics", json={"name": "ledger.eu.audit", "queues": 1})
    assert r.status_code in (201, 409), r.text  # an ordinary name under its pattern
    r = c.session.put(c.url() + sub("ledger", "audit"), json={"max_deliveries": 1}, timeout=30)
    assert r.status_code == 200 and r.json()["dead_letter_topic"] == "ledger.audit.dlq", r.text
