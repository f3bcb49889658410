"""The offset API's consumer groups are bounded as a receive's are, on a real 3-node cluster with
API tokens (issue 19, "consume rights bounded"): a commit under a new group name counts against
``limits.max_groups_per_token`` / ``max_groups_per_topic`` (409 ``too_many_groups``, nothing
stored) while an admin's group is not capped; the offsets of an invented group that nobody commits
or reads expire after ``limits.offset_retention_ms``, those of a configured group stay
(``docs/delivery.md``, "Consumer groups and their bounds")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.client import Consumer, Message

from .harness import Cluster, running, tokens_toml, wait_until

pytestmark = pytest.mark.timeout(300)

ADMIN = "admin-token-Pq8Wm3Zt6Yc1Ld4Rf"
COMMITTER = "committer-token-Hs5Kx2Nv9Bj7Tg"  # consume on counted
OTHER = "other-token-Ue3Ra8Wq1Mz6Xp4Jo"  # consume on counted
FORGETTER = "forgetter-token-Lw7Dn4Qs1Vh8Ck"  # consume on forgetful
MEMBER = "member-token-Gk2Yt9Ce5Rn3Wf"  # consume on membered
TOKENS = [
    ("admin", ADMIN, '["*"]', '["*"]', '["*"]'),
    ("committer", COMMITTER, "[]", "[]", '["counted"]'),
    ("other", OTHER, "[]", "[]", '["counted"]'),
    ("forgetter", FORGETTER, "[]", "[]", '["forgetful"]'),
    ("member", MEMBER, "[]", "[]", '["membered"]'),
]
SECURITY = tokens_toml(TOKENS)
# offset_retention_ms: 15 s, 5 s above subscription_idle_ms (the cluster file allows as little as
# subscription_idle_ms itself, 10 s, with no dormant phase), so a dormant phase (5 s) lies between
# them, and six of the coordinator's touches (every 2.5 s, a quarter of the idle time) fall in one
# retention: a group that only reads, or only has a live member, loses its offsets by the time the
# control group does if the read or the touch were not a use.
CONFIG = (
    "[limits]\nsubscription_idle_ms = 10000\noffset_retention_ms = 15000\nmax_visibility_ms = 8000\n"
    "default_visibility_ms = 1000\nmax_groups_per_topic = 6\nmax_groups_per_token = 4\n"
    "[raft]\nretention_check_ms = 500\n" + SECURITY
)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(tmp_path_factory.mktemp("offset-groups"), extra_toml=CONFIG), ADMIN) as cluster:
        yield cluster


def topic_with_messages(c: Cluster, name: str) -> None:
    r = c.post("/v1/topics", {"name": name, "queues": 2})
    assert r.status_code == 201, r.text
    assert c.produce(name, [{"value": f"m{i}", "queue": i % 2} for i in range(4)]).status_code == 200


def commit(c: Cluster, token: str, topic: str, group: str, node: str | None = None) -> Any:
    body = {"topic": topic, "offsets": {"0": 1, "1": 2}}
    return c.call_as(token, "PUT", f"/v1/groups/{group}/offsets", node, json=body)


def committed(c: Cluster, topic: str, group: str) -> dict[str, int | None]:
    r = c.get(f"/v1/groups/{group}/offsets?topic={topic}")
    assert r.status_code == 200, r.text
    offsets: dict[str, int | None] = r.json()["offsets"]
    return offsets


def groups_of(c: Cluster, topic: str) -> set[str]:
    r = c.get(f"/v1/topics/{topic}/groups")
    assert r.status_code == 200, r.text
    return {g["group"] for g in r.json()["groups"]}


def test_commits_under_more_invented_groups_than_the_caps_are_refused_and_store_nothing(c: Cluster) -> None:
    topic_with_messages(c, "counted")
    nodes = list(c.nodes)
    for i in range(4):  # through every node: the caps hold wherever the commit comes in
        r = commit(c, COMMITTER, "counted", f"made-up-{i}", nodes[i % 3])
        assert r.status_code == 200, r.text
    r = commit(c, COMMITTER, "counted", "made-up-over", nodes[1])
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    assert "max_groups_per_token" in r.json()["error"]["message"]
    assert committed(c, "counted", "made-up-over") == {"0": None, "1": None}  # nothing stored
    # The same caps as a receive's groups: a receive under a fifth name is refused too.
    r = c.call_as(COMMITTER, "POST", "/v1/topics/counted/subscriptions/received/receive", json={})
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    # A known group commits on; its offsets move.
    body = {"topic": "counted", "offsets": {"0": 2}}
    r = c.call_as(COMMITTER, "PUT", "/v1/groups/made-up-0/offsets", nodes[2], json=body)
    assert r.status_code == 200, r.text
    assert committed(c, "counted", "made-up-0") == {"0": 2, "1": 2}
    # The topic's cap: another token's third new group is over the 6 the topic may have.
    for i in range(2):
        assert commit(c, OTHER, "counted", f"other-{i}").status_code == 200
    r = commit(c, OTHER, "counted", "other-over")
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_groups", r.text
    assert "max_groups_per_topic" in r.json()["error"]["message"]
    assert committed(c, "counted", "other-over") == {"0": None, "1": None}
    # An admin's groups are configured: not capped.
    for i in range(3):
        r = commit(c, ADMIN, "counted", f"admins-{i}", nodes[i])
        assert r.status_code == 200, r.text
        assert committed(c, "counted", f"admins-{i}") == {"0": 1, "1": 2}


def test_an_unused_invented_groups_offsets_expire_and_read_or_configured_ones_stay(c: Cluster) -> None:
    topic_with_messages(c, "forgetful")
    for token, group in ((FORGETTER, "forgotten"), (FORGETTER, "reader"), (ADMIN, "kept")):
        r = commit(c, token, "forgetful", group)
        assert r.status_code == 200, r.text
    assert groups_of(c, "forgetful") >= {"forgotten", "reader", "kept"}

    def forgotten_gone() -> bool:
        assert committed(c, "forgetful", "reader") == {"0": 1, "1": 2}  # a read is a use
        return "forgotten" not in groups_of(c, "forgetful")

    # Nobody commits or reads "forgotten": after offset_retention_ms (15 s) its offsets go.
    wait_until(forgotten_gone, 180, interval_s=1, what="the unused invented group's offsets to expire")
    assert committed(c, "forgetful", "forgotten") == {"0": None, "1": None}
    assert committed(c, "forgetful", "kept") == {"0": 1, "1": 2}  # configured: never expires
    assert groups_of(c, "forgetful") >= {"reader", "kept"}
    # The expired group no longer counts against the committer's cap, and starts over if used.
    r = commit(c, FORGETTER, "forgetful", "forgotten")
    assert r.status_code == 200, r.text


def test_an_idle_consumer_groups_offsets_stay_while_it_has_a_live_member(c: Cluster) -> None:
    """Kafka's rule: a group's offsets expire only once it has had no member for the retention.
    A member that stays connected but gets no new message commits nothing; its heartbeats keep
    the group's offsets, while a group nobody uses, committed after the member's last commit,
    loses them."""
    topic_with_messages(c, "membered")
    consumer = Consumer(
        [n.url for n in c.nodes.values()], group="members", topics="membered", token=MEMBER, wait_ms=200
    )
    got: list[Message] = []

    def consume() -> None:
        for m in consumer:
            m.ack()
            got.append(m)

    runner = threading.Thread(target=consume, daemon=True)
    runner.start()
    try:
        wait_until(lambda: committed(c, "membered", "members") == {"0": 2, "1": 2}, 60, what="the commit")
        assert len(got) == 4
        assert commit(c, MEMBER, "membered", "unused").status_code == 200  # the control group
        # Idle from here: no message comes, so the member commits nothing and nobody reads its
        # offsets. The control group goes after offset_retention_ms (15 s) ...
        wait_until(
            lambda: "unused" not in groups_of(c, "membered"),
            180,
            interval_s=1,
            what="the unused group's offsets to expire",
        )
        assert committed(c, "membered", "unused") == {"0": None, "1": None}
        # ... and the group with a live member keeps its record and offsets.
        assert "members" in groups_of(c, "membered")
        assert committed(c, "membered", "members") == {"0": 2, "1": 2}
    finally:
        consumer.close()
        runner.join(30)
