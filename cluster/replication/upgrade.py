"""Rolling upgrades: what a group's leader may write while its voters run different releases.

Every replica must apply every entry to the same state, so a leader writes an op, or an op with
fields added later, only when every voter of the group advertises it: each node lists
:data:`CAPABILITIES` in its status (``capabilities``), derived from the op tables themselves
(``cluster/commands`` ``OPS`` and ``FIELD_LEVELS``, the metadata group's as ``meta.<op>``), so an
op added there is gated without more code. A node whose status lists none runs the release before
capabilities and applies :data:`BEFORE_CAPABILITIES`. Until a capability is everywhere, the
leader writes the previous form, defers periodic work, or answers 503 ``upgrade_in_progress``
(docs/operations.md, "Rolling upgrades").

The produce path: a binary batch proposed as a JSON ``produce`` command.

A queue group's log must be readable by every voter. Until each voter of a group advertises that
it reads format v2 (``batch_formats`` in its status, docs/format.md), the leader turns accepted
binary batches into today's JSON command: per-message work, during the upgrade only. The JSON
command keeps what the batch says: values (text or binary), keys, headers, the producer's id and
sequence (idempotence), a delay as ``deliver_at_ms`` (``now_ms`` + delay, the same instant the
binary command gives) and a TTL (which counts from when the message becomes deliverable in both).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from raftmq import batch as rb
from raftmq.cluster import commands
from raftmq.cluster.commands.append import has_take, is_append
from raftmq.cluster.machines import metadata

__all__ = [
    "BATCH_FORMATS",
    "BEFORE_CAPABILITIES",
    "CAPABILITIES",
    "advertised",
    "capability_of",
    "everywhere",
    "gated_fields_of",
    "old_subscribe",
    "previous_release_refuses",
    "to_json_batch",
]

CAPABILITIES: frozenset[str] = frozenset(
    (
        *commands.OPS,
        *commands.FIELD_LEVELS,
        *(f"meta.{op}" for op in (*metadata.OPS, *metadata.FIELD_LEVELS)),
    )
)
"""The ops and field levels this release applies (its status advertises them to peers)."""

BEFORE_CAPABILITIES: frozenset[str] = frozenset(
    (
        *commands.OPS[: commands.OPS.index("append") + 1],
        *(f"meta.{op}" for op in metadata.OPS[: metadata.OPS.index("record_dead_letters")]),
    )
)
"""What a node that advertises no capabilities applies: the release before them knew the queue-group
ops up to ``append`` and the metadata ops before ``record_dead_letters``, and no field level."""

# The subscribe fields of the release before "subscribe.records".
_OLD_SUBSCRIBE = frozenset(
    {"group", "topic_id", "topic", "dlq_topic_id", "max_deliveries", "backoff_ms", "overwrite"}
)


def advertised(status: dict[str, Any]) -> frozenset[str]:
    """The capabilities a node's status answer advertises (of those this release knows: a newer
    node's others cannot be gated on here, and a peer cannot grow what is remembered of it)."""
    listed = status.get("capabilities")
    if not isinstance(listed, list):
        return BEFORE_CAPABILITIES
    return CAPABILITIES.intersection(c for c in listed if isinstance(c, str))


def everywhere(
    capability: str, own: frozenset[str], peers: Iterable[str], advertised: Mapping[str, frozenset[str]]
) -> bool:
    """Whether every node applies ``capability``: this one (``own``) and each of ``peers``, as it
    advertised last (``advertised``; a peer never heard of applies nothing new)."""
    if capability in BEFORE_CAPABILITIES:
        return True
    return capability in own and all(capability in advertised.get(p, ()) for p in peers)


_OP_PREFIX = b'{"v":1,"op":"'  # how every builder starts a JSON command (v, then op)


def capability_of(group: str, command: bytes, meta: str = "meta") -> str | None:
    """The op a proposal of ``command`` to ``group`` writes, as a capability (``meta.<op>`` in the
    metadata group ``meta``); None for a binary ``append`` or a command not built as the builders
    build them (its op is then checked where it is built). Reads only the command's first bytes:
    ``Node.propose`` calls it for every proposal."""
    if not command.startswith(_OP_PREFIX):
        return None
    end = command.find(b'"', len(_OP_PREFIX), len(_OP_PREFIX) + 64)
    if end < 0:
        return None
    op = command[len(_OP_PREFIX) : end].decode("ascii", "replace")
    return f"meta.{op}" if group == meta else op


# The field levels every road builds into a command of its own, by the op's capability: a topic's
# attributes and tags at creation (the REST API and the SQS API both make topics). Found by the
# field's name as a JSON key (a value that holds one only gates more than needed).
_PROPOSAL_FIELDS: dict[str, tuple[tuple[bytes, str], ...]] = {
    "meta.create_topic": (
        (b'"attributes"', "meta.create_topic.attributes"),
        (b'"tags"', "meta.create_topic.tags"),
    ),
}


def gated_fields_of(capability: str, command: bytes) -> list[str]:
    """The field levels a proposal of ``command`` (its op's ``capability``) writes, of those
    ``Node.propose`` gates itself: the leader may propose it once every voter applies them."""
    return [level for field, level in _PROPOSAL_FIELDS.get(capability, ()) if field in command]


def previous_release_refuses(command: bytes) -> bool:
    """Whether a queue-group replica of the release before capabilities refuses ``command``: an op
    it did not know, or ``subscribe``, ``deliver_tick``, ``commit_offsets``, ``commit_fenced`` or
    ``expire_producers`` with a field it did not know (its decoder
    rejected unknown fields). The test fault ``previous_release_node`` plays that replica with it."""
    if is_append(command):
        return has_take(command)  # version 2 (append.take); it read version 1 only
    try:
        obj = orjson.loads(command)
    except orjson.JSONDecodeError:
        return False  # refused by every release alike
    if type(obj) is not dict:
        return False
    op = obj.get("op")
    if op == "subscribe":
        return not set(obj) <= _OLD_SUBSCRIBE | {"v", "op"}
    if op == "deliver_tick":
        return "expiry_backoff" in obj  # written only as false, the rule after issue 21
    if op == "commit_offsets" or op == "commit_fenced":
        return "advance" in obj
    if op == "expire_producers":
        return "max_states" in obj
    return isinstance(op, str) and op in CAPABILITIES and op not in BEFORE_CAPABILITIES


def old_subscribe(fields: dict[str, Any], exists: bool) -> dict[str, Any] | None:
    """The ``subscribe`` fields a group with a voter of the release before ``subscribe.records``
    applies the same way on every replica, or None when there is no safe old form.

    The old form has no ``configured`` mark, use time or caps, and a subscription it creates is
    configured (never expires, counts against no cap; records of that release read so). So it may
    create one only where the new form would make a configured one too (a ``PUT``, or a receive
    without tokens or by a topic admin); a receive that would create an unconfigured one is
    refused (``upgrade_in_progress``): it would escape the caps and the expiry. On an existing
    subscription it changes what the old release did: the settings (``overwrite``) and a given
    dead-letter link, stored as unchecked (a dead letter then waits parked until a checked link is
    written after the upgrade); its use is not recorded (expiry waits for the upgrade too).
    """
    if not exists and not (fields.get("overwrite") or fields.get("configured")):
        return None
    return {k: v for k, v in fields.items() if k in _OLD_SUBSCRIBE}


BATCH_FORMATS = (1, 2)
"""The record-batch formats this version reads (its status advertises them to peers)."""


def to_json_batch(now_ms: int, topic_id: int, queue: int, data: bytes | memoryview) -> dict[str, Any]:
    """The JSON ``produce`` batch (``cluster/commands/__init__.py``) equal to the v2 batch ``data``
    appended at ``now_ms``."""
    view = rb.read(data)
    messages: list[dict[str, Any]] = []
    for r in view.records():
        m: dict[str, Any] = (
            {"value_b64": base64.b64encode(r.value).decode()}
            if r.binary
            else {"value": r.value.decode("utf-8")}
        )
        if r.key is not None:
            m["key"] = r.key
        if r.headers:
            m["headers"] = r.headers
        if r.delay_ms:
            m["deliver_at_ms"] = now_ms + r.delay_ms
        if r.ttl_ms:
            m["ttl_ms"] = r.ttl_ms
        messages.append(m)
    out: dict[str, Any] = {"topic_id": topic_id, "queue": queue, "messages": messages}
    if view.producer_id is not None:
        out["producer_id"], out["sequence"] = view.producer_id, view.base_sequence
    return out
