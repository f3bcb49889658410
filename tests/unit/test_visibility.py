"""What a token sees of topics it has no right on (``cluster/api/visibility.py``): the SQS attributes
that name other queues, and the samples of ``/metrics``. Pure: a made-up ``sees``."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from raftmq.cluster.api.sqs import move_task_records as records
from raftmq.cluster.api.sqs.queues import allows_redrive_from, redrive_policy
from raftmq.cluster.api.visibility import visible_attributes, visible_metrics
from raftmq.cluster.config.tokens import TokenGrant
from raftmq.cluster.machines.topics import Topic

ARN = "arn:aws:sqs:us-east-1:000000000000:"
MINE = {"mine", "dlq"}


async def sees(name: str) -> bool:
    return name in MINE


def task(task_id: str, destination: str | None) -> dict[str, object]:
    return {
        "id": task_id * 32,
        "status": "COMPLETED",
        "owner": "n1",
        "started_ms": 1,
        "heartbeat_ms": 2,
        "destination": destination,
        "rate": None,
        "moved": 0,
        "to_move": 0,
        "reason": None,
    }


def visible(attributes: dict[str, str]) -> dict[str, str]:
    return asyncio.run(visible_attributes(attributes, sees))


def test_redrive_policies_name_only_the_queues_the_token_sees() -> None:
    policy = json.dumps({"deadLetterTargetArn": ARN + "dlq", "maxReceiveCount": 3})
    hidden = json.dumps({"deadLetterTargetArn": ARN + "theirs", "maxReceiveCount": 3})
    allow = json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [ARN + "mine", ARN + "theirs"]})
    assert visible({"sqs.RedrivePolicy": policy, "other": "x"}) == {"sqs.RedrivePolicy": policy, "other": "x"}
    assert visible({"sqs.RedrivePolicy": hidden, "other": "x"}) == {"other": "x"}
    assert visible({"sqs.RedrivePolicy": "not json"}) == {}  # unreadable: could name anything
    shown = json.loads(visible({"sqs.RedriveAllowPolicy": allow})["sqs.RedriveAllowPolicy"])
    assert shown == {"redrivePermission": "byQueue", "sourceQueueArns": [ARN + "mine"]}
    # The dead-letter queue's admin reads its own allow policy as written (a tool writes it back).
    whole = asyncio.run(visible_attributes({"sqs.RedriveAllowPolicy": allow}, sees, owner=True))
    assert whole == {"sqs.RedriveAllowPolicy": allow}
    # The source queue's admin reads its own RedrivePolicy as written: where its messages go.
    own = asyncio.run(visible_attributes({"sqs.RedrivePolicy": hidden}, sees, owner=True))
    assert own == {"sqs.RedrivePolicy": hidden}
    every = json.dumps({"redrivePermission": "allowAll"})
    assert visible({"sqs.RedriveAllowPolicy": every}) == {"sqs.RedriveAllowPolicy": every}


def test_move_tasks_to_a_queue_the_token_does_not_see_are_left_out() -> None:
    raw = json.dumps([task("a", ARN + "theirs"), task("b", None), task("c", ARN + "mine")])
    shown = records.load(visible({records.ATTRIBUTE: raw})[records.ATTRIBUTE])
    assert [t.id[0] for t in shown] == ["b", "c"]
    only_hidden = json.dumps([task("a", ARN + "theirs")])
    assert visible({records.ATTRIBUTE: only_hidden}) == {records.ATTRIBUTE: "[]"}
    # An entry ``load`` cannot read (here: a bad id) is left out of the text shown, destination and all.
    unreadable = json.dumps([{**task("a", ARN + "theirs"), "id": "bad"}, task("c", ARN + "mine")])
    shown_text = visible({records.ATTRIBUTE: unreadable})[records.ATTRIBUTE]
    assert "theirs" not in shown_text and [t.id[0] for t in records.load(shown_text)] == ["c"]
    only_unreadable = json.dumps([{"destination": ARN + "theirs"}])
    assert visible({records.ATTRIBUTE: only_unreadable}) == {records.ATTRIBUTE: "[]"}


def test_metrics_keep_the_node_s_series_and_the_token_s_topics() -> None:
    body = (
        "# HELP raftmq_queue_messages Messages retained\n"
        "# TYPE raftmq_queue_messages gauge\n"
        'raftmq_queue_messages{topic="mine",queue="0",group_id="1"} 3.0\n'
        'raftmq_queue_messages{topic="theirs",queue="0",group_id="1"} 4.0\n'
        # a group name that spells a topic label (escaped by the exposition format)
        'raftmq_consumer_lag_messages{topic="theirs",queue="0",consumer_group="a,topic=\\"mine\\""} 1.0\n'
        'raftmq_raft_term_rises_total{node_id="n1",group_id="0",cause="campaign",peer="10.0.0.1:7101"} 1.0\n'
        'raftmq_raft_term{node_id="n1",group_id="0"} 2.0\n'
    )
    response = web.Response(body=body.encode(), headers={"Content-Type": "text/plain; version=0.0.4"})
    grant = TokenGrant(name="svc", digest=b"", consume=("mine",))
    shown = asyncio.run(visible_metrics(response, grant, no_table))
    assert isinstance(shown, web.Response) and isinstance(shown.body, bytes)
    assert shown.body.decode().splitlines() == [
        "# HELP raftmq_queue_messages Messages retained",
        "# TYPE raftmq_queue_messages gauge",
        'raftmq_queue_messages{topic="mine",queue="0",group_id="1"} 3.0',
        'raftmq_raft_term{node_id="n1",group_id="0"} 2.0',
    ]
    scraper = TokenGrant(name="scraper", digest=b"", metrics=True)
    assert asyncio.run(visible_metrics(response, scraper, no_table)) is response


async def no_table() -> dict[str, Topic]:
    raise AssertionError("no dead-letter topic among the labels: no table needed")


class CountedTable(dict[str, Topic]):
    """A topic table that counts the walks over all of it."""

    walks = 0

    def values(self):  # type: ignore[override]
        CountedTable.walks += 1
        return super().values()


def test_a_scrape_reads_the_topic_table_once_whatever_its_dead_letter_topics() -> None:
    """Review finding: each ``.dlq`` label cost a copy of the whole topic table (and, on a node
    without a metadata replica, a call to the metadata leader): 5k dead-letter topics took seconds
    of event-loop time per scrape, for any token. Now one table per scrape, walked once."""
    count = 500
    topics = [Topic(i, f"t{i}", 1, (1,), None, None, None, 1) for i in range(count)]
    dead = [Topic(count + i, f"t{i}.g.dlq", 1, (1,), None, None, None, 1, (i, "g")) for i in range(count)]
    table = CountedTable({t.name: t for t in topics + dead})
    fetched = 0

    async def fetch() -> dict[str, Topic]:
        nonlocal fetched
        fetched += 1
        return table

    lines = [f'raftmq_queue_messages{{topic="{t.name}",queue="0"}} 1.0' for t in topics + dead]
    response = web.Response(body="\n".join(lines).encode())
    grant = TokenGrant(name="svc", digest=b"", consume=("t1", "t2"))  # their dead-letter topics too
    CountedTable.walks = 0
    shown = asyncio.run(visible_metrics(response, grant, fetch))
    assert isinstance(shown, web.Response) and isinstance(shown.body, bytes)
    assert [line.split('"')[1] for line in shown.body.decode().splitlines()] == [
        "t1",
        "t2",
        "t1.g.dlq",
        "t2.g.dlq",
    ]
    assert (fetched, CountedTable.walks) == (1, 1)


def test_stored_policies_nested_past_the_parser_are_unreadable_not_a_failure() -> None:
    """A policy text the REST API stored before it refused ``sqs.`` names (up to 8 KiB, so 8,000
    ``[``: past Python 3.11's parser) raised RecursionError in every answer that showed its topic
    (GET /v1/topics for every token that sees it), and made every receive and move task start of
    the queue fail. 50,000 ``[`` here: past every supported Python's parser (checked first)."""
    deep = "[" * 50_000
    with pytest.raises(RecursionError):
        json.loads(deep)
    stored = {"sqs.RedrivePolicy": deep, "sqs.RedriveAllowPolicy": deep, records.ATTRIBUTE: deep}
    assert visible(stored) == {records.ATTRIBUTE: "[]"}
    topic = Topic(1, "q", 1, (0,), None, None, None, 1, attributes=stored)
    assert redrive_policy(topic) is None
    assert not allows_redrive_from(topic, ARN + "mine")
