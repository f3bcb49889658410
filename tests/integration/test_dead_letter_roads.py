"""A dead-letter topic's permissions go by its source's name through every road, on a real cluster
with API tokens (``docs/security.md``, "Permissions"): through a node that holds no replica of the
metadata group (n4, added to three nodes later), as through the others. ``ledger.*`` matches
``ledger.billing.dlq`` but must reach nothing of ledger's dead letters."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from .cluster_changes import placement, run_change
from .harness import Cluster, tokens_toml

pytestmark = pytest.mark.timeout(300)

ADMIN = "admin-token-Hq7Wd2Lm9Xc4Vb8Nz"
GLOB = "ledger-glob-token-Pk3Rt6Yu1Ao5Se"  # everything on ledger.* (ledger.eu, ...), nothing on ledger
OWNER = "ledger-owner-token-Mz8Qw2Er5Ty9Ui"  # consume and produce on ledger (and its dead letters)
MIXED = "ledger-mixed-token-Lk4Jh7Gf1Ds3Ap"  # consume on ledger, admin on ledger.* only
TOKENS = [
    ("admin", ADMIN, '["*"]', '["*"]', '["*"]'),
    ("ledger-glob", GLOB, '["ledger.*"]', '["ledger.*"]', '["ledger.*"]'),
    ("ledger-owner", OWNER, "[]", '["ledger"]', '["ledger"]'),
    ("ledger-mixed", MIXED, '["ledger.*"]', "[]", '["ledger"]'),
]
CONFIG = "[delivery]\nmax_deliveries = 1\nbackoff_ms = [100]\ntick_ms = 100\n" + tokens_toml(TOKENS)
NO_META = "n4"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes, and n4 added to them (``join = true``): the metadata group stays on n1-n3."""
    cluster = Cluster(
        tmp_path_factory.mktemp("dead-letter-roads"),
        nodes=4,
        queue_groups=3,
        extra_toml=CONFIG,
        node_toml=lambda n: "join = true" if n == NO_META else "",
    )
    with cluster:
        cluster.session.headers["Authorization"] = f"Bearer {ADMIN}"
        cluster.start()
        cluster.wait_ready(["n1", "n2", "n3"])
        n4 = cluster.nodes[NO_META]
        body = {"id": NO_META, "http": n4.http, "raft": f"127.0.0.1:{n4.raft_base}"}
        run_change(cluster, "POST", "/v1/cluster/nodes", body)
        cluster.wait_ready()
        assert NO_META not in placement(cluster)["placement"]["groups"]["meta"]
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), f"{nid} died:\n{cluster.log(nid)[-3000:]}"


def sub(topic: str, group: str, action: str = "") -> str:
    return f"/v1/topics/{topic}/subscriptions/{group}" + (f"/{action}" if action else "")


def dead_letter_one(c: Cluster, topic: str, value: str, group: str = "billing") -> str:
    """``value`` into the dead-letter topic of ``topic``'s group ``group`` (configured by the
    admin); that topic's name."""
    r = c.post("/v1/topics", {"name": topic, "queues": 1})
    assert r.status_code in (201, 409), r.text
    r = c.session.put(c.url() + sub(topic, group), json={"max_deliveries": 1}, timeout=30)
    assert r.status_code == 200 and r.json()["dead_letter_topic"] == f"{topic}.{group}.dlq", r.text
    assert c.produce(topic, [{"value": value}]).status_code == 200
    r = c.post(sub(topic, group, "receive"), {"wait_ms": 10_000, "max": 1})
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    r = c.post(sub(topic, group, "nack"), {"receipts": [m["receipt"]]})
    assert r.json()["results"][0].get("dead_lettered") is True, r.text
    return f"{topic}.{group}.dlq"


def glob_refused_everywhere(c: Cluster, dlq: str, nodes: list[str]) -> None:
    """Every road of ``dlq`` the ledger.* token tries, through each of ``nodes``, is 403."""
    path = f"/v1/topics/{dlq}"
    for node in nodes:
        refused = [
            c.call_as(GLOB, "GET", path, node),
            c.call_as(GLOB, "GET", path + "/queues/0/messages?offset=0&max=100", node),
            c.call_as(GLOB, "GET", path + "/segments", node),
            c.call_as(GLOB, "POST", path + "/messages", node, json={"messages": [{"value": "injected"}]}),
            c.call_as(GLOB, "POST", path + "/subscriptions/g/receive", node, json={"wait_ms": 0}),
            c.call_as(GLOB, "GET", path + "/groups", node),
            c.call_as(GLOB, "GET", f"/v1/groups/g/offsets?topic={dlq}", node),
            c.call_as(GLOB, "PUT", "/v1/groups/g/offsets", node, json={"topic": dlq, "offsets": {"0": 0}}),
            c.call_as(GLOB, "DELETE", path, node),
        ]
        for r in refused:
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (r.request.url, r.text)
        names = {t["name"] for t in c.call_as(GLOB, "GET", "/v1/topics", node).json()["topics"]}
        assert dlq not in names, (node, names)


def test_a_node_without_a_metadata_replica_guards_a_dead_letter_topic_by_its_sources_name(c: Cluster) -> None:
    dlq = dead_letter_one(c, "ledger", "ledger-secret")
    glob_refused_everywhere(c, dlq, [NO_META, "n1"])
    # Nor may it create a topic under a dead-letter name of ledger there.
    r = c.call_as(GLOB, "POST", "/v1/topics", NO_META, json={"name": "ledger.audit.dlq", "queues": 1})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    assert c.get(f"/v1/topics/{dlq}").json()["queues"][0]["high_offset"] == 1  # nothing injected, still there
    # The common case keeps working through n4: ledger.* reads ledger.eu's dead letters.
    eu = dead_letter_one(c, "ledger.eu", "eu-secret")
    r = c.call_as(GLOB, "GET", f"/v1/topics/{eu}/queues/0/messages?offset=0&max=100", NO_META)
    assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == ["eu-secret"], r.text


def test_the_dead_letters_of_a_dead_letter_topic_go_by_the_first_sources_name(c: Cluster) -> None:
    dlq = dead_letter_one(c, "ledger", "ledger-secret", group="vault")  # ledger.vault.dlq
    nested = dead_letter_one(c, dlq, "nested-secret", group="g")  # ledger.vault.dlq.g.dlq: ledger's too
    glob_refused_everywhere(c, nested, list(c.nodes))
    r = c.get(f"/v1/topics/{nested}/queues/0/messages?offset=0&max=100")
    assert len(r.json()["messages"]) == 1, r.text  # one dead letter there, nothing injected


def test_a_token_with_admin_on_a_pattern_matching_a_dead_letter_name_cannot_act_on_its_group_members(
    c: Cluster,
) -> None:
    dlq = dead_letter_one(c, "ledger", "member-secret", group="members")  # ledger.members.dlq
    r = c.post("/v1/topics", {"name": "ledger.eu", "queues": 1})
    assert r.status_code in (201, 409), r.text

    def join(token: str, topics: list[str], node: str | None = None) -> requests.Response:
        body = {"member_id": "m-owner", "topics": topics}
        return c.call_as(token, "POST", "/v1/groups/grp/members", node, json=body)

    assert join(OWNER, [dlq]).status_code == 200
    for node in c.nodes:  # the coordinator and forwarding nodes alike
        leave = c.call_as(GLOB, "DELETE", "/v1/groups/grp/members/m-owner", node)
        for r in (leave, join(GLOB, ["ledger.eu"], node)):
            assert r.status_code == 403 and r.json()["error"]["code"] == "member_not_owned", (node, r.text)
    r = join(OWNER, [dlq])  # its owner's member, untouched: still consuming ledger's dead letters
    assert r.status_code == 200 and r.json()["assignment"] == {dlq: [0]}, r.text
    r = c.call_as(OWNER, "DELETE", "/v1/groups/grp/members/m-owner")
    assert r.status_code == 200 and r.json()["left"] is True, r.text


def test_admin_on_a_pattern_matching_a_dead_letter_name_configures_no_group_there(c: Cluster) -> None:
    dlq = dead_letter_one(c, "ledger", "made-secret", group="made")  # ledger.made.dlq: MIXED consumes it
    r = c.call_as(MIXED, "POST", sub(dlq, "h", "receive"), json={"wait_ms": 10_000, "max": 1})
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    r = c.call_as(MIXED, "POST", sub(dlq, "h", "nack"), json={"receipts": [m["receipt"]]})
    assert r.json()["results"] == [{"receipt": m["receipt"], "ok": True, "parked": True}], r.text
    time.sleep(3)  # looked at again after 1 s and reported: a consumer's group creates no topic
    assert f"{dlq}.h.dlq" not in {t["name"] for t in c.get("/v1/topics").json()["topics"]}


def test_a_made_up_dead_letter_name_costs_no_topic_list_at_the_leader(c: Cluster) -> None:
    """A name that looks like a dead-letter topic and is none, through a node with a replica that
    does not know it: the node asks the metadata leader for that one topic, not for every topic
    (any token could repeat the request, and a large cluster's list is megabytes to serialise)."""
    meta = c.wait_leader("meta")
    entry = next(n for n in ("n1", "n2", "n3") if n != meta)
    lists = c.requests_served("/internal/topics")
    for i in range(5):
        r = requests.get(
            c.url(entry) + f"/v1/topics/nope{i}.billing.dlq",
            headers={"Authorization": f"Bearer {GLOB}"},
            timeout=30,
        )
        assert r.status_code in (403, 404), r.text
    assert c.requests_served("/internal/topics") == lists
