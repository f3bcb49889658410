"""Who may call which SQS action on a cluster with API tokens (docs/sqs.md, docs/security.md).

Authentication: a SigV4 signature (``sigv4.py``) whose access key id is an API token's name and
whose secret access key is that token's, derived from the cluster secret
(``keys.sqs_secret_key``; a token holder reads it from ``GET /v1/sqs/credentials``).

Authorization: the token's per-topic permissions, as on the REST API, on the queue the action names
(a queue is the topic of the same name), through the same names as every REST route
(``ApiCore.permission_names``: a dead-letter topic answers for its source). :data:`RIGHTS` maps every
action; deny by default: an action missing there is refused as ``InvalidAction`` before it runs,
with or without tokens (``routes.py``), and :func:`authorize` refuses it too.

Invariant: the queue an action acts on is the one its :class:`Right` checked. Every action reads
its queue from the parameter ``Right.source`` names, through :func:`queue_name_of` (the actions'
``_queue`` too); a request posted to a queue's URL acts on that queue only
(:func:`bind_path_queue`). A batch's entries name no queue: their receipt handles carry the
queue's topic id, which the action checks against the queue the request names.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.config.tokens import ADMIN, CONSUME, PERMISSIONS, PRODUCE, TokenGrant

__all__ = [
    "RIGHTS",
    "Right",
    "authorize",
    "authorize_redrive_target",
    "bind_path_queue",
    "queue_name_of",
    "refuse_unknown",
]

TopicNames = Callable[[str, bool], Awaitable[list[str]]]


@dataclass(frozen=True)
class Right:
    """What an action needs: every permission of ``needs`` (any one with ``any_of``) on the queue
    named by the parameter ``source`` (a queue URL, a queue name or an ARN); ``source`` None: any
    valid token (the answer is then filtered to the token's queues)."""

    needs: tuple[str, ...] = ()
    source: str | None = "QueueUrl"
    any_of: bool = False
    creating: bool = False


_ANY = Right(PERMISSIONS, any_of=True)
_ADMIN, _PRODUCE, _CONSUME = Right((ADMIN,)), Right((PRODUCE,)), Right((CONSUME,))
RIGHTS: dict[str, Right] = {
    "CreateQueue": Right((ADMIN,), source="QueueName", creating=True),
    "GetQueueUrl": Right(PERMISSIONS, source="QueueName", any_of=True),
    "ListQueues": Right(source=None),
    "DeleteQueue": _ADMIN,
    "GetQueueAttributes": _ANY,
    "SetQueueAttributes": _ADMIN,
    # As the REST API's PUT /v1/groups/{group}/offsets, which PurgeQueue is: consume.
    "PurgeQueue": _CONSUME,
    "SendMessage": _PRODUCE,
    "SendMessageBatch": _PRODUCE,
    "ReceiveMessage": _CONSUME,
    "DeleteMessage": _CONSUME,
    "DeleteMessageBatch": _CONSUME,
    "ChangeMessageVisibility": _CONSUME,
    "ChangeMessageVisibilityBatch": _CONSUME,
    "TagQueue": _ADMIN,
    "UntagQueue": _ADMIN,
    "ListQueueTags": _ANY,
    "ListDeadLetterSourceQueues": _ANY,
    "AddPermission": _ADMIN,
    "RemovePermission": _ADMIN,
    # A move task receives from the dead-letter queue (consume there) and sends to its destination
    # (produce there: checked below, or per source queue by the action without a DestinationArn).
    "StartMessageMoveTask": Right((CONSUME,), source="SourceArn"),
    "CancelMessageMoveTask": Right((CONSUME,), source="TaskHandle"),
    "ListMessageMoveTasks": Right((CONSUME,), source="SourceArn"),
}


def queue_name_of(value: Any, source: str) -> str | None:
    """The queue a parameter names: the last path segment of a queue URL, the last field of an
    ARN (``arn:aws:sqs:<region>:<account>:<name>``), a task handle's queue, or the name itself."""
    if not isinstance(value, str) or not value:
        return None
    if source == "QueueUrl":
        try:
            path = urllib.parse.urlsplit(value).path
        except ValueError:  # no URL ("http://[::1/..."): no queue, refused as InvalidAddress, not a 500
            return None
        return path.rstrip("/").rsplit("/", 1)[-1] or None
    if source == "SourceArn":
        return value.rsplit(":", 1)[-1] or None
    if source == "TaskHandle":  # <queue>:<task id>, the handle the move tasks are to hand out
        return value.split(":", 1)[0] or None
    return value


def refuse_unknown(action: str) -> Right:
    """The right ``action`` needs; an action not in :data:`RIGHTS` is refused (InvalidAction)."""
    right = RIGHTS.get(action)
    if right is None:
        raise SqsError("InvalidAction", f"The action {action[:64]} is not valid for this endpoint.")
    return right


def bind_path_queue(action: str, params: dict[str, Any], url: str, queue: str) -> None:
    """A request posted to a queue's URL (``url``, naming ``queue``: the query protocol's way,
    either wire is held to it) acts on that queue: its QueueUrl is the path's unless it gives one,
    which must name the same queue, as must a QueueName (InvalidAddress otherwise, so that a proxy
    that lets a path through lets through no other queue); so must a move task's SourceArn or
    TaskHandle. Actions naming no queue (ListQueues) are left alone."""
    source = refuse_unknown(action).source
    if source is None:
        return
    given = params.get(source)
    if given is not None and queue_name_of(given, source) != queue:
        raise SqsError(
            "InvalidAddress", f"The {source} names another queue than the URL the request was posted to."
        )
    if source == "QueueUrl":
        params.setdefault("QueueUrl", url)


async def authorize(action: str, params: dict[str, Any], grant: TokenGrant, names: TopicNames) -> None:
    """Raise AccessDenied unless ``grant`` may run ``action`` with ``params`` (InvalidAction for an
    action not in :data:`RIGHTS`); a StartMessageMoveTask with a DestinationArn ``produce`` on
    that queue. A RedrivePolicy set by CreateQueue or SetQueueAttributes also needs the right of
    :func:`authorize_redrive_target`, which the actions check (``redrive_rights.py``: a policy the
    queue already has needs none)."""
    right = refuse_unknown(action)
    if right.source is None:
        return
    queue = queue_name_of(params.get(right.source), right.source)
    # A request without its queue: refused by the action (MissingParameter) if the token has the
    # permission on some queue, as the REST API does with a malformed request.
    checked = [None] if queue is None else await names(queue, right.creating)
    await _check(action, grant, right, checked)
    destination = params.get("DestinationArn")
    if action == "StartMessageMoveTask" and destination is not None:
        target = queue_name_of(destination, "SourceArn")
        await _check(action, grant, _PRODUCE, [None] if target is None else await names(target, False))


async def authorize_redrive_target(action: str, grant: TokenGrant, names: TopicNames, target: str) -> None:
    """Raise AccessDenied unless ``grant`` has ``produce`` or ``admin`` on ``target``, the
    dead-letter queue of a RedrivePolicy it sets: the source's dead letters are sent there."""
    await _check(action, grant, Right((PRODUCE, ADMIN), any_of=True), await names(target, False))


async def _check(action: str, grant: TokenGrant, right: Right, checked: Sequence[str | None]) -> None:
    for topic in checked:
        granted = [p for p in right.needs if grant.allows(p, topic)]
        if (right.any_of and not granted) or (not right.any_of and len(granted) < len(right.needs)):
            what = " or ".join(right.needs) if right.any_of else " and ".join(right.needs)
            raise SqsError(
                "AccessDenied",
                f"Access to the resource is denied: token {grant.name!r} lacks {what} permission "
                f"on {'any queue' if topic is None else repr(topic)} for {action}.",
            )
