"""Queue locks in the delivery state machine (``cluster/machines/delivery/__init__.py``): acquire, renew and
release the exclusive lock of a queue, and the epoch fence of locked receives and settlements."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import Refused
from raftmq.cluster.machines.delivery.state import _check_topic, _Work
from raftmq.storage import keys, queues
from raftmq.storage.keys import LockState

if TYPE_CHECKING:
    from raftmq.cluster.commands import LockCommand, UnlockCommand
    from raftmq.cluster.machines.apply import Apply
    from raftmq.storage.store import Store


def check_fence(store: Store, group: str, topic_id: int, queue_list: Iterable[int], epoch: int) -> None:
    """Refuse (``stale_epoch``) unless every queue's lock for ``group`` has ``epoch``. The lease
    need not be live: while nobody else took the lock, its holder's epoch is still the newest.
    (The apply's fence, and a queue group's leader's before it proposes: ``answered_here``.)"""
    for queue in queue_list:
        lock_state = queues.lock_state(store, group, topic_id, queue)
        if lock_state is None or lock_state.epoch != epoch:
            raise Refused(
                errors.STALE_EPOCH,
                f"epoch {epoch} is not the lock epoch of queue {queue}",
                queue=queue,
                epoch=None if lock_state is None else lock_state.epoch,
            )


# -- locks (ordered consumption) ----------------------------------------------------------------


def lock(work: Apply, cmd: LockCommand) -> dict[str, Any]:
    """Acquire or renew the exclusive lock of a queue for ``consumer``.

    Refused with ``lock_held`` while another consumer's lease is live. The holder renewing keeps
    its epoch (also after its lease ran out, as long as nobody else took the lock: its commits
    stayed the newest); a new holder, or the same one after releasing, gets ``epoch + 1``.

    Result: ``{"consumer", "epoch", "lease_until_ms", "committed_offset"}`` (the offset to resume
    from, or None).
    """
    topic_id, queue, group, consumer, now_ms = (
        cmd["topic_id"],
        cmd["queue"],
        cmd["group"],
        cmd["consumer"],
        cmd["now_ms"],
    )
    _check_topic(work, topic_id)
    current = queues.lock_state(work.store, group, topic_id, queue)
    if current is not None and current.live(now_ms) and current.holder != consumer:
        raise Refused(
            errors.LOCK_HELD,
            f"queue {queue} is locked by another consumer",
            holder=current.holder,
            lease_until_ms=current.lease_until_ms,
        )
    renew = current is not None and current.holder == consumer and current.lease_until_ms != 0
    epoch = current.epoch if renew and current is not None else (0 if current is None else current.epoch) + 1
    new = LockState(epoch, now_ms + cmd["lease_ms"], consumer)
    work.batch.put(keys.lock_key(topic_id, queue, group), new.encode())
    _Work(work, now_ms).touch(topic_id, group, new.lease_until_ms)  # in use while the lease lasts
    return {
        "consumer": consumer,
        "epoch": epoch,
        "lease_until_ms": new.lease_until_ms,
        "committed_offset": queues.committed_offset(work.store, group, topic_id, queue),
    }


def unlock(work: Apply, cmd: UnlockCommand) -> dict[str, Any]:
    """Release the lock if ``consumer`` holds it with ``epoch`` (the epoch is kept, so the next
    holder gets a higher one). Result: ``{"released": bool}``."""
    topic_id, queue, group = cmd["topic_id"], cmd["queue"], cmd["group"]
    current = queues.lock_state(work.store, group, topic_id, queue)
    if current is None or current.holder != cmd["consumer"] or current.epoch != cmd["epoch"]:
        return {"released": False}
    if current.lease_until_ms != 0:
        work.batch.put(keys.lock_key(topic_id, queue, group), replace(current, lease_until_ms=0).encode())
        work.changed[(topic_id, queue)] = None
    return {"released": True}
