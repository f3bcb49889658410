"""Deduplicated appends (``dedup_produce``): a message whose deduplication key the queue saw within
the window is not stored again, and is answered with the original's offset and id, as an SQS FIFO
queue answers a resend (``docs/sqs.md``).

State per (topic, queue) (keys in ``storage/keys.py``): a :class:`~raftmq.storage.keys.DedupEntry`
per remembered key (``F``), an index of the entries by expiry over the whole queue group (``f``),
and the number of entries a queue holds (``N``).

Invariants:

- Pure: the window is judged on the command's ``now_ms`` (the group's time), never a clock. An
  entry counts while ``now_ms < expires_ms``; an entry past it is as absent even before it is purged.
- Bounded: a queue holds at most :data:`MAX_DEDUP_ENTRIES` entries. Every apply first purges up to
  :data:`PURGE_PER_APPLY` expired entries of the group (oldest first), and a command whose new
  entries would exceed the bound stores none of its messages (``dedup_window_full``, each message;
  the purge is still written, so the window frees itself as entries expire).
- ``N`` equals the number of ``F`` keys of its queue, and every ``F`` key has exactly one ``f`` key
  at its ``expires_ms``. ``drop_topic`` removes ``F`` and ``N`` (``TOPIC_PREFIXES``); the ``f`` keys
  it leaves are deleted when they expire, their entry being gone.
"""

from __future__ import annotations

from typing import Any

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import error_body
from raftmq.cluster.commands import DedupProduceCommand
from raftmq.cluster.machines.append import append_messages
from raftmq.cluster.machines.apply import Apply
from raftmq.storage import dedup_keys, keys
from raftmq.storage.dedup_keys import DedupEntry
from raftmq.storage.queues import scan_prefix
from raftmq.storage.records import NewMessage

__all__ = ["DEDUP_WINDOW_MS", "MAX_DEDUP_ENTRIES", "PURGE_PER_APPLY", "apply_dedup_produce", "purge_expired"]

DEDUP_WINDOW_MS = 300_000
"""How long a deduplication key is remembered (SQS's 5 minutes), from the send that stored it."""
MAX_DEDUP_ENTRIES = 100_000
"""The most keys one queue's window holds: over 5 minutes, 333 deduplicated sends a second."""
PURGE_PER_APPLY = 1_000
"""The most expired entries one apply deletes (more than any command adds: the window shrinks)."""


def purge_expired(
    work: Apply, now_ms: int, counts: dict[tuple[int, int], int]
) -> set[tuple[int, int, bytes]]:
    """Delete up to :data:`PURGE_PER_APPLY` entries whose time is over, oldest first; ``counts``
    (the queues' entry counts, loaded as needed) is updated. Returns the entries deleted."""
    purged: set[tuple[int, int, bytes]] = set()
    for key, _ in scan_prefix(work.store, keys.DEDUP_EXPIRY, limit=PURGE_PER_APPLY):
        expires_ms, topic_id, queue, dedup = dedup_keys.decode_dedup_expiry_key(key)
        if expires_ms > now_ms:
            break
        work.batch.delete(key)
        entry_key = dedup_keys.dedup_key(topic_id, queue, dedup)
        data = work.store.get(entry_key)
        if data is None or DedupEntry.decode(data).expires_ms != expires_ms:
            continue  # its topic was dropped, or the key was stored again since (another index key)
        work.batch.delete(entry_key)
        counts[(topic_id, queue)] = _count(work, counts, topic_id, queue) - 1
        purged.add((topic_id, queue, dedup))
    return purged


def _count(work: Apply, counts: dict[tuple[int, int], int], topic_id: int, queue: int) -> int:
    if (topic_id, queue) not in counts:
        data = work.store.get(dedup_keys.dedup_count_key(topic_id, queue))
        counts[(topic_id, queue)] = 0 if data is None else keys.decode_u64(data)
    return counts[(topic_id, queue)]


def apply_dedup_produce(work: Apply, cmd: DedupProduceCommand, max_entry_messages: int) -> dict[str, Any]:
    """Append the messages whose key the queue's window does not hold (nor an earlier message of
    the command), in order, as one record batch, and remember their keys until ``now_ms`` +
    :data:`DEDUP_WINDOW_MS`.

    Result: ``{"results": [r, ...]}``, one per message: ``{"offset", "id"}`` of the message stored,
    or for a duplicate the original's, with ``"duplicate": true``; or an error body for each
    (``topic_not_found``: the topic was dropped; ``dedup_window_full``: nothing of the command
    was stored)."""
    counts: dict[tuple[int, int], int] = {}
    purged = purge_expired(work, cmd["now_ms"], counts)
    result = _append(work, cmd, counts, purged, max_entry_messages)
    for (topic_id, queue), n in counts.items():
        if n:
            work.batch.put(dedup_keys.dedup_count_key(topic_id, queue), keys.encode_u64(n))
        else:
            work.batch.delete(dedup_keys.dedup_count_key(topic_id, queue))
    return result


def _append(
    work: Apply,
    cmd: DedupProduceCommand,
    counts: dict[tuple[int, int], int],
    purged: set[tuple[int, int, bytes]],
    max_entry_messages: int,
) -> dict[str, Any]:
    now_ms, topic_id, queue = cmd["now_ms"], cmd["topic_id"], cmd["queue"]
    n = len(cmd["messages"])
    if work.is_dropped(topic_id):
        return {"results": [error_body(errors.TOPIC_NOT_FOUND, f"topic {topic_id} was dropped")] * n}
    if n > max_entry_messages:
        return {"results": [error_body(errors.REQUEST_TOO_LARGE, "too many messages")] * n}

    def stored(dedup: bytes) -> DedupEntry | None:  # as the store holds it after the purge
        if (topic_id, queue, dedup) in purged:
            return None
        data = work.store.get(dedup_keys.dedup_key(topic_id, queue, dedup))
        return None if data is None else DedupEntry.decode(data)

    seen: dict[bytes, tuple[int, str]] = {}  # keys of this command: the message that stored them
    fresh: dict[bytes, tuple[int, str]] = {}
    base_offset = work.meta(topic_id, queue).high_offset
    storing: list[NewMessage] = []
    answers: list[dict[str, Any]] = []
    for m in cmd["messages"]:
        earlier = seen.get(m.dedup)
        if earlier is None:
            entry = stored(m.dedup)
            if entry is not None and now_ms < entry.expires_ms:
                earlier = seen[m.dedup] = (entry.offset, entry.message_id)
        if earlier is not None:
            answers.append({"offset": earlier[0], "id": earlier[1], "duplicate": True})
            continue
        offset = base_offset + len(storing)
        storing.append(m.message)
        seen[m.dedup] = fresh[m.dedup] = (offset, m.message_id)
        answers.append({"offset": offset, "id": m.message_id})
    count = _count(work, counts, topic_id, queue)
    replaced = {d: stored(d) for d in fresh}  # an expired entry not purged yet, or None
    added = [d for d, old in replaced.items() if old is None]
    if count + len(added) > MAX_DEDUP_ENTRIES:
        message = (
            f"the deduplication window of queue {queue} holds {count} ids (at most {MAX_DEDUP_ENTRIES} "
            f"for {DEDUP_WINDOW_MS // 1000} s): nothing was stored"
        )
        return {"results": [error_body(errors.DEDUP_WINDOW_FULL, message)] * n}
    if storing:
        result = append_messages(work, now_ms, topic_id, queue, storing)
        if "error" in result:
            return {"results": [result] * n}
    expires_ms = now_ms + DEDUP_WINDOW_MS
    for dedup, (offset, message_id) in fresh.items():
        old = replaced[dedup]
        if old is not None:  # expired, not purged yet: its index key goes with it
            work.batch.delete(dedup_keys.dedup_expiry_key(old.expires_ms, topic_id, queue, dedup))
        work.batch.put(
            dedup_keys.dedup_key(topic_id, queue, dedup), DedupEntry(expires_ms, offset, message_id).encode()
        )
        work.batch.put(dedup_keys.dedup_expiry_key(expires_ms, topic_id, queue, dedup), b"")
    counts[(topic_id, queue)] = count + len(added)
    return {"results": answers}
