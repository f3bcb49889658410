"""Committed offsets on a real 3-node cluster: a late copy of an older consumer commit cannot move
the group's offset back (the chaos soak's committed offsets that went backwards); an explicit set
still may."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from .harness import Cluster, wait_until

TOPIC = "orders"
GROUP = "billing"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp: Path = tmp_path_factory.mktemp("offsets")
    with Cluster(tmp, nodes=3) as c:
        c.start()
        c.wait_ready()
        c.wait_balanced()
        c.create_topic(TOPIC, queues=1)
        r = c.produce(TOPIC, [{"value": f"m{i}", "key": "k"} for i in range(300)])
        assert r.status_code == 200, r.text
        yield c


def commit(c: Cluster, node: str, offset: int, **extra: Any) -> requests.Response:
    body = {"topic": TOPIC, "offsets": {"0": offset}, **extra}
    return c.session.put(f"{c.url(node)}/v1/groups/{GROUP}/offsets", json=body, timeout=60)


def committed(c: Cluster, node: str) -> int | None:
    r = c.get(f"/v1/groups/{GROUP}/offsets", node, params={"topic": TOPIC})
    r.raise_for_status()
    offset: int | None = r.json()["offsets"]["0"]
    return offset


def late_commit_after_newer(c: Cluster, **extra: Any) -> tuple[requests.Response, dict[str, Any]]:
    """Commit 50, then 100 through a paused node while 200 goes through the leader, then resume
    the node: its copy of 100 is forwarded to the leader after 200 was applied. Returns the late
    commit's answer and the newer one's."""
    group_id = str(c.get(f"/v1/topics/{TOPIC}").json()["queues"][0]["group_id"])
    leader = c.wait_leader(group_id)
    meta = c.wait_leader("meta")
    # A node that leads neither the queue's group nor the metadata group (pausing it elects no new
    # leader of either): it forwards the commit it holds to the queue's leader when it resumes.
    slow = next(n for n in c.nodes if n not in (leader, meta))
    assert commit(c, leader, 50, **extra).status_code == 200

    late: list[requests.Response] = []
    c.nodes[slow].proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        # The kernel accepts the connection and buffers the request; the node reads it on resume.
        sender = threading.Thread(target=lambda: late.append(commit(c, slow, 100, **extra)))
        sender.start()
        time.sleep(0.5)
        newer = commit(c, leader, 200, **extra)  # the consumer's next commit (or its retry elsewhere)
        assert newer.status_code == 200, newer.text
    finally:
        c.nodes[slow].proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    sender.join(60)
    assert late and late[0].status_code == 200, late and late[0].text
    return late[0], newer.json()


def test_a_consumer_commit_held_up_at_a_paused_node_does_not_move_a_newer_one_back(cluster: Cluster) -> None:
    late, newer = late_commit_after_newer(cluster, advance=True)
    assert newer["offsets"] == {"0": {"offset": 200, "applied": True}}
    # The late copy is answered as success, and says it was kept out.
    assert late.json()["offsets"] == {"0": {"offset": 200, "applied": False}}
    for node in cluster.nodes:
        assert committed(cluster, node) == 200


def test_a_late_explicit_set_lands_as_sent(cluster: Cluster) -> None:
    """The route the soak's commits went back by, kept for an explicit set: a set is applied as
    sent, whenever it arrives (so an operator's rewind works; a consumer's commit is advance-only)."""
    late, _ = late_commit_after_newer(cluster)
    assert late.json()["offsets"] == {"0": {"offset": 100, "applied": True}}
    for node in cluster.nodes:
        assert committed(cluster, node) == 100


def test_an_explicit_set_through_the_offset_api_still_rewinds(cluster: Cluster) -> None:
    c = cluster
    assert commit(c, "n1", 250, advance=True).status_code == 200
    r = commit(c, "n2", 10)  # an operator's rewind: no advance
    assert r.status_code == 200, r.text
    assert r.json()["offsets"] == {"0": {"offset": 10, "applied": True}}
    assert wait_until(lambda: committed(c, "n3") == 10, 10, what="the rewind")


@pytest.mark.parametrize("advance", ["yes", 1, None, []])
def test_a_non_boolean_advance_is_refused_and_changes_nothing(cluster: Cluster, advance: Any) -> None:
    c = cluster
    before = committed(c, "n1")
    r = commit(c, "n1", 0, advance=advance)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "bad_request"
    assert committed(c, "n1") == before
