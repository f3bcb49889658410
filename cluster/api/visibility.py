"""What a token sees of topics it has no right on: nothing, not even their names (docs/security.md,
"What a token can see"), but for the policies set on a queue its admin reads as written (below).

A topic's answer may name other topics in the attributes the SQS API keeps: a queue's
``sqs.RedrivePolicy`` names its dead-letter queue, ``sqs.RedriveAllowPolicy`` the queues that may
use it as theirs, ``sqs.MessageMoveTasks`` each task's destination. A token sees such a name only
with some right on that queue (:data:`Sees`); otherwise the RedrivePolicy is left out, the allow
policy lists only the queues it sees, and a move task to a queue it does not see is left out. Both
policies are shown as written to a token with ``admin`` on the queue that holds them (``owner``):
each is that queue's admin's own setting. The allow policy is text tools read, change and write
back (filtered, a write-back would drop the sources hidden from it); the RedrivePolicy says where
the queue's own messages go after ``maxReceiveCount`` receives (hidden, its admin saw a queue
without one whose messages vanished, and a tool saw drift and set it again, which needs a right
on the dead-letter queue). The name it shows was put there by a token with ``produce`` or
``admin`` on the dead-letter queue (``sqs/redrive_rights.py``): a source's admin cannot make it name a
queue it has no right on, so it learns only where its own messages are sent. The
REST answers (``GET``/``PATCH /v1/topics/{topic}``, ``GET /v1/topics``, filtered by the
authentication middleware at the entry node) and the SQS actions (GetQueueAttributes,
ListMessageMoveTasks) go through :func:`visible_attributes` alike. The queue names these
attributes hold are SQS queue names (no dots, so never a dead-letter topic's ``<source>.<group>.dlq``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import hdrs, web

from raftmq.cluster.api.sqs import move_task_records as records
from raftmq.cluster.api.sqs.queues import REDRIVE_ALLOW_POLICY, REDRIVE_POLICY, read_json
from raftmq.cluster.config.tokens import ADMIN, TokenGrant
from raftmq.cluster.machines.topics import Topic, permission_names

__all__ = [
    "Sees",
    "TopicTable",
    "grant_owns",
    "grant_sees",
    "table_sees",
    "visible_attributes",
    "visible_metrics",
    "visible_topic_answer",
    "visible_topic_list",
]

Sees = Callable[[str], Awaitable[bool]]
TopicNames = Callable[[str, bool], Awaitable[list[str]]]
TopicTable = Callable[[], Awaitable[Mapping[str, Topic]]]  # every topic by name (ApiCore.topic_table)
# A sample's topic label (topic names hold no quote or backslash), and a label holding a Raft address.
_TOPIC_LABEL = re.compile(rb'[{,]topic="([^"\\]*)"')
_PEER_LABEL = re.compile(rb"[{,]peer=")


def grant_sees(grant: TokenGrant | None, names: TopicNames) -> Sees:
    """Whether ``grant`` (None: no tokens, or a peer) may see a topic's name: some right on every
    name its permissions go by (``ApiCore.permission_names``), or cluster admin."""

    async def sees(name: str) -> bool:
        if grant is None or grant.cluster_admin:
            return True
        return all(grant.allows_any(n) for n in await names(name, False))

    return sees


async def grant_owns(grant: TokenGrant | None, names: TopicNames, topic: str) -> bool:
    """Whether ``grant`` has ``admin`` on ``topic`` (on every name its permissions go by)."""
    if grant is None or grant.cluster_admin:
        return True
    return all(grant.allows(ADMIN, n) for n in await names(topic, False))


def table_sees(grant: TokenGrant | None, table: Mapping[str, Topic]) -> Callable[[str], bool]:
    """:func:`grant_sees` over one snapshot of the topic table, for many names at once: pure (no
    fetch, no await, so it runs off the event loop), the table walked once for all names, and each
    name weighed once."""
    by_id = {t.id: t for t in table.values()}
    seen: dict[str, bool] = {}

    def sees(name: str) -> bool:
        if grant is None or grant.cluster_admin:
            return True
        if name not in seen:
            seen[name] = all(grant.allows_any(n) for n in permission_names(name, table, by_id=by_id))
        return seen[name]

    return sees


def _arn_queue(arn: Any) -> str | None:
    return arn.rsplit(":", 1)[-1] if isinstance(arn, str) and arn else None


async def visible_attributes(
    attributes: dict[str, str], sees: Sees, *, owner: bool = False
) -> dict[str, str]:
    """``attributes`` without the names of queues ``sees`` refuses; a value that cannot be read is
    left out whole (it could name anything). ``owner``: the token has ``admin`` on the queue these
    attributes are of, whose RedrivePolicy and RedriveAllowPolicy it then sees as written."""
    out = dict(attributes)
    if out.get(REDRIVE_POLICY) and not owner:
        policy = read_json(out[REDRIVE_POLICY])
        target = _arn_queue(policy.get("deadLetterTargetArn")) if isinstance(policy, dict) else None
        if target is None or not await sees(target):
            del out[REDRIVE_POLICY]
    if out.get(REDRIVE_ALLOW_POLICY) and not owner:
        policy = read_json(out[REDRIVE_ALLOW_POLICY])
        arns = policy.get("sourceQueueArns", []) if isinstance(policy, dict) else None
        if not isinstance(arns, list) or policy is None:
            del out[REDRIVE_ALLOW_POLICY]
        else:
            kept = [a for a in arns if (q := _arn_queue(a)) is not None and await sees(q)]
            if kept != arns:
                policy["sourceQueueArns"] = kept
                out[REDRIVE_ALLOW_POLICY] = json.dumps(policy, separators=(",", ":"))
    if out.get(records.ATTRIBUTE):
        # Shown as the dump of the records kept, never the stored text: ``load`` drops an entry it
        # cannot read, whose destination the raw text would still name.
        tasks = records.load(out[records.ATTRIBUTE])
        kept_tasks = [t for t in tasks if t.destination is None or await _sees_arn(t.destination, sees)]
        out[records.ATTRIBUTE] = records.dump(kept_tasks) if kept_tasks else "[]"
    return out


async def _sees_arn(arn: str, sees: Sees) -> bool:
    queue = _arn_queue(arn)
    return queue is not None and await sees(queue)


async def _visible_topic(item: dict[str, Any], sees: Sees, owner: bool) -> dict[str, Any]:
    attributes = item.get("attributes")
    if not isinstance(attributes, dict) or not attributes:
        return item
    return {**item, "attributes": await visible_attributes(attributes, sees, owner=owner)}


async def visible_topic_answer(response: web.StreamResponse, sees: Sees, owner: bool) -> web.StreamResponse:
    """A topic's answer (``GET``/``PATCH /v1/topics/{topic}``) as the token may see it; ``owner``:
    it has ``admin`` on that topic."""
    data = _json_answer(response)
    if data is None or not isinstance(data.get("attributes"), dict):
        return response
    return _answer(await _visible_topic(data, sees, owner))


async def visible_topic_list(
    response: web.StreamResponse, grant: TokenGrant, sees: Sees
) -> web.StreamResponse:
    """``GET /v1/topics`` as ``grant`` may see it: only topics it has some right on (a dead-letter
    topic by its source's name, :func:`_permission_name`), their attributes as it may see them."""
    data = _json_answer(response)
    if data is None or grant.cluster_admin:
        return response
    topics = data.get("topics", [])
    by_name = {str(t.get("name")): t for t in topics}
    shown = [t for t in topics if grant.allows_any(_permission_name(t, by_name))]
    data["topics"] = [
        await _visible_topic(t, sees, grant.allows(ADMIN, _permission_name(t, by_name))) for t in shown
    ]
    return _answer(data)


async def visible_metrics(
    response: web.StreamResponse, grant: TokenGrant, table: TopicTable
) -> web.StreamResponse:
    """``GET /metrics`` as ``grant`` may see it: in full for a cluster admin or a token with
    ``metrics = true``; for any other token without the samples of topics it has no right on
    (their topic and consumer group names) and without those labelled with a Raft address
    (``peer``). The families' ``# HELP``/``# TYPE`` lines stay: they name no topic. Any token may
    scrape, so the cost is bounded: the topic table is read once per scrape (only when a
    dead-letter topic's name is among the labels), and the text is read off the event loop."""
    if (
        grant.cluster_admin
        or grant.metrics
        or response.status != 200
        or not isinstance(response, web.Response)
    ):
        return response
    body = response.body
    if not isinstance(body, bytes):
        return response
    loop = asyncio.get_running_loop()
    dead_letter = await loop.run_in_executor(None, _names_dead_letter_topic, body)
    snapshot = await table() if dead_letter else {}
    kept = await loop.run_in_executor(None, _visible_lines, body, table_sees(grant, snapshot))
    content_type = response.headers.get(hdrs.CONTENT_TYPE, "text/plain")
    return web.Response(body=kept, headers={hdrs.CONTENT_TYPE: content_type})


def _names_dead_letter_topic(body: bytes) -> bool:
    return any(name.endswith(b".dlq") for name in _TOPIC_LABEL.findall(body))


def _visible_lines(body: bytes, sees: Callable[[str], bool]) -> bytes:
    """``body`` without the samples labelled with a Raft address or a topic ``sees`` refuses."""
    kept = []
    for line in body.split(b"\n"):
        if not line.startswith(b"#"):
            if _PEER_LABEL.search(line):
                continue
            topic = _TOPIC_LABEL.search(line)
            if topic is not None and not sees(topic.group(1).decode()):
                continue
        kept.append(line)
    return b"\n".join(kept)


def _json_answer(response: web.StreamResponse) -> dict[str, Any] | None:
    if response.status != 200 or not isinstance(response, web.Response):
        return None
    if not isinstance(response.body, bytes):
        return None
    data = orjson.loads(response.body)
    return data if isinstance(data, dict) else None


def _answer(data: dict[str, Any]) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE), status=200, content_type="application/json"
    )


def _permission_name(item: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> str:
    """The name a listed topic's permissions go by, as ``machines.topics.permission_names`` finds
    it: a dead-letter topic's source (the list names it), followed through the sources the list
    shows as dead-letter topics themselves."""
    name, seen = str(item.get("name")), set()
    while name not in seen:
        seen.add(name)
        source = item.get("dead_letter_of")
        if not (isinstance(source, dict) and isinstance(source.get("topic"), str)):
            break
        name = source["topic"]
        item = by_name.get(name, {})
    return name
