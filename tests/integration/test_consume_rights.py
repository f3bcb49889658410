"""Consume rights create nothing permanent, on a real 3-node cluster with API tokens: a receive or
push stream under a new consumer group creates no topic; the dead letters of a group no admin
configured stay parked, and move to the dead-letter topic once an admin configures the group
(``docs/delivery.md``); removing a group member needs the token that created it; a join answer
names no other member; the topic list (API and ``raftmq topic list``)
shows dead-letter topics under their source."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from .harness import Cluster, running, wait_until

pytestmark = pytest.mark.timeout(240)

ADMIN_TOKEN = "admin-token-Wq4Lp9Zx2Nc7Vb1Mk"
CONSUMER_TOKEN = "consumer-token-Hy6Tr3Ed8Ws5Qa0"  # consume on orders and payments
PAYMENTS_TOKEN = "payments-token-Jk2Fd7Sa9Gh4Lz3"  # consume on payments only
SECURITY_TOML = f"""
[security]
[[security.tokens]]
name = "admin"
token = "{ADMIN_TOKEN}"
admin = ["*"]
produce = ["*"]
consume = ["*"]

[[security.tokens]]
name = "consumer"
token = "{CONSUMER_TOKEN}"
consume = ["orders", "payments"]

[[security.tokens]]
name = "payments-consumer"
token = "{PAYMENTS_TOKEN}"
consume = ["payments"]
"""
DELIVERY = "[delivery]\nmax_deliveries = 1\nbackoff_ms = [100]\ntick_ms = 100\n"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("consume-rights"), extra_toml=DELIVERY + SECURITY_TOML)
    with running(cluster, ADMIN_TOKEN):  # the harness's own calls as admin
        yield cluster


def as_consumer(
    c: Cluster, method: str, path: str, node: str | None = None, token: str = CONSUMER_TOKEN, **kw: Any
) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    return c.session.request(method, c.url(node) + path, headers=headers, timeout=30, **kw)


def topic_names(c: Cluster) -> set[str]:
    r = c.get("/v1/topics")
    assert r.status_code == 200, r.text
    return {t["name"] for t in r.json()["topics"]}


def sub(topic: str, group: str, action: str = "") -> str:
    return f"/v1/topics/{topic}/subscriptions/{group}" + (f"/{action}" if action else "")


def test_receives_and_push_streams_under_new_groups_create_no_topic(c: Cluster) -> None:
    ensure_topic(c, "orders", 2)
    assert c.produce("orders", [{"value": f"o{i}", "queue": i % 2} for i in range(4)]).status_code == 200
    before = topic_names(c)
    for i, node in enumerate(c.nodes):  # the coordinator and forwarding nodes alike
        r = as_consumer(c, "POST", sub("orders", f"new-{i}", "receive"), node, json={"wait_ms": 2000})
        assert r.status_code == 200, r.text
        assert r.json()["messages"], r.text  # the subscription works without a dead-letter topic

    async def stream(group: str) -> list[dict[str, Any]]:
        url = c.url("n2").replace("http", "ws", 1) + sub("orders", group, "stream")
        headers = {"Authorization": f"Bearer {CONSUMER_TOKEN}"}
        async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
            hello = await ws.receive_json(timeout=30)
            assert hello["type"] == "hello", hello
            await ws.send_json({"op": "rdy", "n": 10})
            frame = await ws.receive_json(timeout=30)
            assert frame["type"] == "messages", frame
            messages: list[dict[str, Any]] = frame["messages"]
            return messages

    assert asyncio.run(stream("streamed"))
    assert topic_names(c) == before
    for group in ("new-0", "new-1", "new-2", "streamed"):
        assert c.get(f"/v1/topics/orders.{group}.dlq").status_code == 404


def test_an_unconfigured_groups_dead_letter_is_parked_until_an_admin_configures_the_group(c: Cluster) -> None:
    ensure_topic(c, "payments", 3)
    assert c.produce("payments", [{"value": "poison", "key": "p", "queue": 2}]).status_code == 200
    r = as_consumer(c, "POST", sub("payments", "workers", "receive"), json={"wait_ms": 10_000})
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    r = as_consumer(c, "POST", sub("payments", "workers", "nack"), json={"receipts": [m["receipt"]]})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [{"receipt": m["receipt"], "ok": True, "parked": True}]
    time.sleep(3)  # looked at again after 1 s and reported: consume rights create no topic
    assert "payments.workers.dlq" not in topic_names(c)
    r = as_consumer(c, "POST", sub("payments", "workers", "receive"), json={"wait_ms": 1500})
    assert r.status_code == 200 and r.json()["messages"] == [], r.text  # not handed out again
    # An admin configures the group: its dead-letter topic is created, the parked letter moves.
    r = c.session.put(c.url() + sub("payments", "workers"), json={"max_deliveries": 1}, timeout=30)
    assert r.status_code == 200, r.text

    def listed() -> list[dict[str, Any]]:
        r = as_consumer(c, "GET", sub("payments", "workers", "dlq"))
        assert r.status_code == 200, r.text
        messages: list[dict[str, Any]] = r.json()["messages"]
        return messages

    (letter,) = wait_until(listed, 30, what="the parked dead letter in the configured dead-letter topic")
    assert (letter["queue"], letter["value"], letter["key"]) == (2, "poison", "p")
    headers = letter["headers"]
    assert (headers["raftmq-dlq-reason"], headers["raftmq-dlq-attempts"]) == ("nacked", "1")
    dlq = c.get("/v1/topics/payments.workers.dlq").json()
    assert dlq["queue_groups"] == c.get("/v1/topics/payments").json()["queue_groups"]
    # The next dead letter of the group goes there at once.
    assert c.produce("payments", [{"value": "second", "queue": 0}]).status_code == 200
    r = as_consumer(c, "POST", sub("payments", "workers", "receive"), json={"wait_ms": 10_000})
    (m,) = r.json()["messages"]
    r = as_consumer(c, "POST", sub("payments", "workers", "nack"), json={"receipts": [m["receipt"]]})
    assert r.json()["results"] == [{"receipt": m["receipt"], "ok": True, "dead_lettered": True}]


def ensure_topic(c: Cluster, name: str, queues: int) -> None:
    r = c.post("/v1/topics", {"name": name, "queues": queues})
    assert r.status_code in (201, 409), r.text
    assert len(c.get(f"/v1/topics/{name}").json()["queues"]) == queues


def join(c: Cluster, group: str, member_id: str, topics: list[str], node: str | None = None) -> Any:
    body = {"member_id": member_id, "topics": topics, "generation": 0}
    return as_consumer(c, "POST", f"/v1/groups/{group}/members", node, json=body)


def test_a_join_answer_names_no_other_member(c: Cluster) -> None:
    ensure_topic(c, "orders", 2)
    assert join(c, "accounting", "member-alice-7f3e", ["orders"]).status_code == 200
    r = join(c, "accounting", "member-bob-2c9d", ["orders"])
    assert r.status_code == 200, r.text
    answer = r.json()
    assert "member-alice-7f3e" not in r.text
    assert answer["members"] == ["member-bob-2c9d"]
    assert answer["allocation"] == {"orders": [1]}  # bob's share of two queues over two members
    assert set(answer) >= {"group", "member_id", "generation", "assignment"}


def test_removing_a_member_needs_the_token_that_created_it(c: Cluster) -> None:
    ensure_topic(c, "orders", 2)
    ensure_topic(c, "payments", 3)
    assert join(c, "billing", "carol", ["orders", "payments"]).status_code == 200
    for node in c.nodes:  # the metadata leader and the nodes that forward to it
        r = as_consumer(c, "DELETE", "/v1/groups/billing/members/carol", node, token=PAYMENTS_TOKEN)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "member_not_owned" and "'carol'" in r.json()["error"]["message"]
    # Still a member: its next heartbeat keeps its queues.
    r = join(c, "billing", "carol", ["orders", "payments"])
    assert r.status_code == 200 and r.json()["assignment"] == {"orders": [0, 1], "payments": [0, 1, 2]}
    r = as_consumer(c, "DELETE", "/v1/groups/billing/members/carol", "n3")
    assert r.status_code == 200 and r.json()["left"] is True, r.text


def test_the_topic_list_shows_dead_letter_topics_under_their_source(c: Cluster) -> None:
    ensure_topic(c, "payments", 3)
    ensure_topic(c, "payments-eu", 3)  # sorts between payments and payments.<group>.dlq by name
    r = c.session.put(c.url() + sub("payments", "auditors"), json={"max_deliveries": 2}, timeout=30)
    assert r.status_code == 200, r.text  # an admin's PUT creates the dead-letter topic
    ensure_topic(c, "lonely.g.dlq", 1)  # named like one, but no topic "lonely": a plain topic
    r = c.get("/v1/topics")
    assert r.status_code == 200, r.text
    topics = r.json()["topics"]
    names = [t["name"] for t in topics]
    marked = {t["name"]: t["dead_letter_of"] for t in topics if "dead_letter_of" in t}
    assert marked["payments.auditors.dlq"] == {"topic": "payments", "group": "auditors"}
    assert "payments" not in marked and "payments-eu" not in marked and "lonely.g.dlq" not in marked
    under_payments = names[names.index("payments") + 1 : names.index("payments-eu")]
    assert "payments.auditors.dlq" in under_payments
    assert all(marked.get(n, {}).get("topic") == "payments" for n in under_payments), names

    # raftmq topic list shows them under their source too.
    out = subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", "topic", "list", "--url", c.url("n2")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RAFTMQ_TOKEN": ADMIN_TOKEN, "COLUMNS": "120"},
    )
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.splitlines()]
    first = [i for i, line in enumerate(lines) if line.split()[:1] == ["payments"]]
    nested = [i for i, line in enumerate(lines) if line.startswith("└ payments.auditors.dlq")]
    eu = [i for i, line in enumerate(lines) if line.startswith("payments-eu ")]
    assert first and nested and eu and first[0] < nested[0] < eu[0], out.stdout
    assert any(line.startswith("lonely.g.dlq ") for line in lines), out.stdout
