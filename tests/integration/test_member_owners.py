"""Consumer-group members belong to the API token that created them, on a real 3-node cluster with
tokens: another token can neither heartbeat, re-join nor remove a member (403 member_not_owned, at
the coordinator and through the nodes that forward to it) unless it is admin on all the member's
topics; members are capped per token and per topic (409 too_many_members); the members route shows
a topic's own generation, which the group's other topics do not move; the Python client's Consumer
keeps consuming under its token through a coordinator kill, and under a new id when another token
holds its id."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.client import Consumer, Message

from .harness import Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

ADMIN_TOKEN = "admin-token-Pq7Wm2Lx9Cv4Bn6Zt"
LEDGER_TOKEN = "ledger-token-Fs8Kd3Hj5Ty1Ur7Ei"  # the service whose members are attacked
INTRUDER_TOKEN = "intruder-token-Ga4Sx6Dc2Vf9Bg3"  # consume on payments only
PAYMENTS_ADMIN_TOKEN = "payments-admin-Yh5Nj8Mk1Lo3Pi7"  # admin on payments, not payments.eu
OPS_TOKEN = "ops-token-Qw9Er2Ty6Ui4Op8As1D"  # admin on both of ledger's topics
SECURITY_TOML = f"""
[limits]
max_members_per_token = 3
max_members_per_topic = 5
max_topics_per_request = 2

[security]
[[security.tokens]]
name = "admin"
token = "{ADMIN_TOKEN}"
admin = ["*"]
produce = ["*"]
consume = ["*"]

[[security.tokens]]
name = "ledger"
token = "{LEDGER_TOKEN}"
consume = ["payments", "payments.eu"]

[[security.tokens]]
name = "intruder"
token = "{INTRUDER_TOKEN}"
consume = ["payments"]

[[security.tokens]]
name = "payments-admin"
token = "{PAYMENTS_ADMIN_TOKEN}"
admin = ["payments"]
consume = ["payments", "payments.eu"]

[[security.tokens]]
name = "ops"
token = "{OPS_TOKEN}"
admin = ["payments", "payments.eu"]
consume = ["payments", "payments.eu", "crowded"]
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("member-owners"), extra_toml=SECURITY_TOML) as cluster:
        cluster.session.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"  # the harness's own calls
        cluster.start()
        cluster.wait_ready()
        cluster.wait_balanced()
        for name, queues in (("payments", 2), ("payments.eu", 2), ("crowded", 1)):
            r = cluster.post("/v1/topics", {"name": name, "queues": queues})
            assert r.status_code in (201, 409), r.text
        yield cluster


def join(
    c: Cluster,
    token: str,
    group: str,
    member_id: str,
    topics: list[str],
    node: str | None = None,
    **body: Any,
) -> Any:
    return c.call_as(
        token,
        "POST",
        f"/v1/groups/{group}/members",
        node,
        json={"member_id": member_id, "topics": topics, **body},
    )


def leave(c: Cluster, token: str, group: str, member_id: str, node: str | None = None) -> Any:
    return c.call_as(token, "DELETE", f"/v1/groups/{group}/members/{member_id}", node)


def members(c: Cluster, token: str, topic: str, group: str) -> dict[str, Any]:
    r = c.call_as(token, "GET", f"/v1/topics/{topic}/groups/{group}/members")
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def refused(r: Any, status: int, code: str) -> bool:
    return bool(r.status_code == status and r.json()["error"]["code"] == code)


def test_another_token_can_neither_rejoin_nor_remove_a_member_unless_admin_on_all_its_topics(
    c: Cluster,
) -> None:
    r = join(c, LEDGER_TOKEN, "billing", "ledger-1", ["payments", "payments.eu"], generation=0)
    assert r.status_code == 200, r.text
    first = r.json()
    r = join(
        c, LEDGER_TOKEN, "billing", "ledger-1", ["payments", "payments.eu"], generation=first["generation"]
    )
    assert r.json()["assignment"] == {"payments": [0, 1], "payments.eu": [0, 1]}
    eu_before = members(c, ADMIN_TOKEN, "payments.eu", "billing")
    assert eu_before["state"] == "stable"
    # The probe: the intruder finds the member id on the topic it may read ...
    listed = members(c, INTRUDER_TOKEN, "payments", "billing")
    assert [m["member_id"] for m in listed["members"]] == ["ledger-1"]
    # ... and re-joins as it with payments only, and removes it: refused at every node (the
    # coordinator and the two that forward to it); so is an admin of one of its two topics.
    for token in (INTRUDER_TOKEN, PAYMENTS_ADMIN_TOKEN):
        for node in c.nodes:
            r = join(c, token, "billing", "ledger-1", ["payments"], node, generation=0)
            assert refused(r, 403, "member_not_owned"), (node, r.text)
            assert "ledger-1" in r.json()["error"]["message"] and "ledger-token" not in r.text
            r = leave(c, token, "billing", "ledger-1", node)
            assert refused(r, 403, "member_not_owned"), (node, r.text)
    # Nothing changed: the member keeps both topics, and payments.eu did not rebalance.
    r = join(
        c, LEDGER_TOKEN, "billing", "ledger-1", ["payments", "payments.eu"], generation=first["generation"]
    )
    assert r.status_code == 200 and r.json()["assignment"] == {"payments": [0, 1], "payments.eu": [0, 1]}
    assert r.json()["generation"] == first["generation"]
    eu_after = members(c, ADMIN_TOKEN, "payments.eu", "billing")
    assert (eu_after["generation"], eu_after["state"]) == (eu_before["generation"], "stable")
    # An admin of both its topics may heartbeat it and remove it (through a forwarding node too).
    for node in c.nodes:
        r = join(c, OPS_TOKEN, "billing", "ledger-1", ["payments", "payments.eu"], node)
        assert r.status_code == 200, (node, r.text)
    r = leave(c, OPS_TOKEN, "billing", "ledger-1", "n3")
    assert r.status_code == 200 and r.json()["left"] is True, r.text
    assert members(c, ADMIN_TOKEN, "payments", "billing")["state"] == "empty"


def test_a_join_naming_more_topics_than_a_request_may_is_refused_whole(c: Cluster) -> None:
    # Over limits.max_topics_per_request (2) the names are not looked up one by one: the join must
    # then go no further, though the coordinator itself takes up to 100 topics.
    for node in c.nodes:
        r = join(c, INTRUDER_TOKEN, "billing", "intruder-many", ["payments", "payments.eu", "crowded"], node)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", (node, r.text)
    r = leave(c, ADMIN_TOKEN, "billing", "intruder-many")
    assert r.status_code == 200 and r.json()["left"] is False, r.text  # never joined


def test_a_client_body_cannot_name_the_token_a_member_acts_for(c: Cluster) -> None:
    assert join(c, LEDGER_TOKEN, "named", "ledger-2", ["payments"]).status_code == 200
    for node in c.nodes:
        body = {"member_id": "ledger-2", "topics": ["payments"], "token": "ledger"}
        r = c.call_as(INTRUDER_TOKEN, "POST", "/v1/groups/named/members", node, json=body)
        assert refused(r, 400, "bad_request"), (node, r.text)
    assert leave(c, LEDGER_TOKEN, "named", "ledger-2").json()["left"] is True


def test_members_are_capped_per_token_and_per_topic(c: Cluster) -> None:
    for i in range(3):
        r = join(c, ADMIN_TOKEN, f"crowd-{i}", "m", ["crowded"], f"n{i + 1}")
        assert r.status_code == 200, r.text
    for node in c.nodes:  # the token's cap, at the coordinator and through the others
        r = join(c, ADMIN_TOKEN, "crowd-3", "m", ["crowded"], node)
        assert refused(r, 409, "too_many_members") and "max_members_per_token" in r.text, (node, r.text)
    assert members(c, ADMIN_TOKEN, "crowded", "crowd-3")["member_count"] == 0  # nothing was made
    # An existing member may still heartbeat at the cap.
    assert join(c, ADMIN_TOKEN, "crowd-0", "m", ["crowded"]).status_code == 200
    for i in range(2):
        assert join(c, OPS_TOKEN, "ops-crowd", f"o{i}", ["crowded"]).status_code == 200
    r = join(c, OPS_TOKEN, "ops-crowd", "o2", ["crowded"])  # the topic's cap: 5 members on it
    assert refused(r, 409, "too_many_members") and "'crowded'" in r.text, r.text
    r = join(c, OPS_TOKEN, "ops-crowd", "o0", ["crowded", "payments"])  # another topic is free
    assert r.status_code == 200, r.text
    assert leave(c, ADMIN_TOKEN, "crowd-0", "m").json()["left"] is True  # a leave frees a place
    assert join(c, OPS_TOKEN, "ops-crowd", "o2", ["crowded"]).status_code == 200
    for group, member_id, token in [
        ("crowd-1", "m", ADMIN_TOKEN),
        ("crowd-2", "m", ADMIN_TOKEN),
        *(("ops-crowd", f"o{i}", OPS_TOKEN) for i in range(3)),
    ]:
        assert leave(c, token, group, member_id).json()["left"] is True


def test_the_members_route_shows_the_topics_own_generation(c: Cluster) -> None:
    r = join(c, LEDGER_TOKEN, "shared", "eu-reader", ["payments.eu"], generation=0)
    assert r.status_code == 200, r.text
    r = join(c, INTRUDER_TOKEN, "shared", "p-reader", ["payments"], generation=0)
    assert r.status_code == 200, r.text
    r = join(c, INTRUDER_TOKEN, "shared", "p-reader", ["payments"], generation=r.json()["generation"])
    seen = members(c, INTRUDER_TOKEN, "payments", "shared")
    assert seen["state"] == "stable"
    # payments.eu rebalances three times: the group's generation moves, payments' does not.
    for member_id in ("eu-2", "eu-3"):
        assert join(c, LEDGER_TOKEN, "shared", member_id, ["payments.eu"], generation=0).status_code == 200
    assert leave(c, LEDGER_TOKEN, "shared", "eu-3").json()["left"] is True
    group_generation = join(c, LEDGER_TOKEN, "shared", "eu-reader", ["payments.eu"]).json()["generation"]
    assert group_generation > seen["generation"]
    after = members(c, INTRUDER_TOKEN, "payments", "shared")
    assert (after["generation"], after["state"]) == (seen["generation"], "stable")
    assert [m["applied_generation"] for m in after["members"]] == [seen["generation"]]
    for token, member_id in (
        (LEDGER_TOKEN, "eu-reader"),
        (LEDGER_TOKEN, "eu-2"),
        (INTRUDER_TOKEN, "p-reader"),
    ):
        assert leave(c, token, "shared", member_id).json()["left"] is True


def consume(consumer: Consumer, want: set[str], got: set[str], timeout_ms: int = 60_000) -> None:
    def more() -> bool:
        batch: list[Message] = consumer.poll(timeout_ms=200)
        for m in batch:
            got.add(str(m.value))
            m.ack()
        return want <= got

    wait_until(more, timeout_ms / 1000, what=f"{len(want - got)} of {len(want)} messages")


def produce(c: Cluster, topic: str, values: list[str]) -> None:
    r = c.post(f"/v1/topics/{topic}/messages", {"messages": [{"value": v} for v in values]})
    assert r.status_code == 200, r.text


def test_a_consumer_whose_id_another_token_holds_goes_on_under_a_new_id(c: Cluster) -> None:
    assert join(c, INTRUDER_TOKEN, "squatted", "ledger-7", ["payments"]).status_code == 200
    consumer = Consumer(
        [n.url for n in c.nodes.values()],
        group="squatted",
        topics=["payments"],
        member_id="ledger-7",
        token=LEDGER_TOKEN,
        wait_ms=200,
    )
    got: set[str] = set()
    try:
        values = [f"sq{i}" for i in range(20)]
        produce(c, "payments", values)
        # The intruder's member holds half the queues until it expires; leave it to take them all.
        assert leave(c, INTRUDER_TOKEN, "squatted", "ledger-7").json()["left"] is True
        consume(consumer, set(values), got)
        assert consumer.member_id is not None and consumer.member_id != "ledger-7"
        ids = [m["member_id"] for m in members(c, ADMIN_TOKEN, "payments", "squatted")["members"]]
        assert ids == [consumer.member_id]
    finally:
        consumer.close()


def test_a_consumer_with_a_token_keeps_its_member_through_a_coordinator_kill(c: Cluster) -> None:
    consumer = Consumer(
        [n.url for n in c.nodes.values()],
        group="settle",
        topics=["payments", "payments.eu"],
        member_id="ledger-settle",
        token=LEDGER_TOKEN,
        wait_ms=200,
    )
    got: set[str] = set()
    coordinator = c.wait_leader("meta")
    try:
        before = [f"b{i}" for i in range(20)]
        produce(c, "payments.eu", before)
        consume(consumer, set(before), got)
        c.kill(coordinator)
        c.wait_leader("meta", exclude=coordinator)
        after = [f"a{i}" for i in range(20)]
        survivor = next(n for n in c.nodes if n != coordinator)
        wait_until(
            lambda: (
                c.post(
                    "/v1/topics/payments.eu/messages", {"messages": [{"value": v} for v in after]}, survivor
                ).status_code
                == 200
            ),
            30,
            what="a produce after the kill",
        )
        consume(consumer, set(after), got)
        assert consumer.member_id == "ledger-settle"
        # The consumer keeps fetching its queues while it waits for the new coordinator; its
        # next heartbeat makes it a member there again, under its own id and token.
        wait_until(
            lambda: (
                [m["member_id"] for m in members(c, ADMIN_TOKEN, "payments.eu", "settle")["members"]]
                == ["ledger-settle"]
            ),
            30,
            what="the consumer's member at the new coordinator",
        )
        # The new coordinator knows the member's owner again from its heartbeat.
        r = join(c, INTRUDER_TOKEN, "settle", "ledger-settle", ["payments"], survivor)
        assert refused(r, 403, "member_not_owned"), r.text
    finally:
        consumer.close()
        c.start(coordinator)
        c.wait_ready()
