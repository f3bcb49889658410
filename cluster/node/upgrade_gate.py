"""The rolling-upgrade gate of the delivery writes (``cluster/replication/upgrade.py``): what a
leader writes, or refuses with 503 ``upgrade_in_progress``, while a voter of its group runs a
release that cannot apply the newer form. Nothing here writes: the caller proposes the answer."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import orjson

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import CatalogError, RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.delivery import read_subscription
from raftmq.cluster.node.node import Node
from raftmq.cluster.replication.upgrade import old_subscribe
from raftmq.storage.store import Store

__all__ = ["after_upgrade", "ensure_dlq_command", "gated_fields"]


async def after_upgrade(call: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    """The answer of ``call``, or None when it was refused with ``upgrade_in_progress`` (e.g. a
    ``PUT`` subscription's dead-letter topic: made after the upgrade, its dead letters wait parked
    until then and the first one parked after it asks for the topic)."""
    try:
        return await call
    except RaftmqError as e:
        if e.error is not errors.UPGRADE_IN_PROGRESS:
            raise
        return None


def ensure_dlq_command(node: Node, source: str, group: str, at_ms: int) -> bytes:
    """The ``ensure_dlq_topic`` command the metadata leader proposes, once every metadata voter
    finds and records dead-letter topics by their source record and the older topics got theirs
    (``record_dead_letters``): a replica of the release before would find or create the topic by
    name.

    Raises:
        RaftmqError: ``upgrade_in_progress`` until then.
    """
    metadata = node.metadata
    if (
        not node.group_supports(META, "meta.ensure_dlq_topic.records")
        or metadata is None
        or metadata.needs_dead_letter_records
    ):
        raise CatalogError(
            errors.UPGRADE_IN_PROGRESS,
            "a metadata replica runs an older release: dead-letter topics are created once every "
            "node is upgraded",
        )
    ensure = {"v": 1, "op": "ensure_dlq_topic", "source": source, "group": group, "now_ms": at_ms}
    return orjson.dumps({**ensure, "by_record": True})


def gated_fields(node: Node, name: str, store: Store, op: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``op`` the leader of queue group ``name`` proposes: ``fields``, but for
    ``subscribe`` their older form (``upgrade.old_subscribe``) until every voter applies
    ``subscribe.records``, and for ``commit_fenced`` no ``advance`` (a set) until every voter applies
    ``commit_offsets.advance``.

    Raises:
        RaftmqError: ``upgrade_in_progress`` when there is no safe older form (a receive that would
            make a new unconfigured consumer group).
    """
    if op == "commit_fenced" and not node.group_supports(name, "commit_offsets.advance"):
        return {k: v for k, v in fields.items() if k != "advance"}  # a set, as before the field
    if op != "subscribe" or node.group_supports(name, "subscribe.records"):
        return fields
    old = old_subscribe(fields, read_subscription(store, fields["topic_id"], fields["group"]) is not None)
    if old is None:
        raise CatalogError(
            errors.UPGRADE_IN_PROGRESS,
            f"a replica of group {name} runs an older release: a receive makes a new consumer group "
            "once every node is upgraded (an admin's PUT makes one now)",
        )
    return old
