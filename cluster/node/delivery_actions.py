"""The delivery writes this node runs as a group's leader (``docs/delivery.md``): ``subscribe``,
``receive``, ``await`` (wait until something is available, hand out nothing), ``ack``, ``nack``,
``extend``, ``release``, ``ack_receive`` (an ack taking the next messages along), ``lock``,
``unlock``, ``commit_fenced``, ``redrive``, ``touch_subscriptions``, ``dlq_list`` at a queue group's
leader, ``ensure_dlq`` at the metadata leader.

The HTTP routes (``cluster/api/handlers/subscriptions.py``, ``dlq_locks.py``, ``push.py``), the
receive coordinator and the SQS API reach them through the node's ``LeaderRouter``: here when this
node leads the group, else at the leader's ``/internal/groups/{g}/{action}``. Each checks its
command before proposing it, so bad input costs no entry; failures are :class:`RaftmqError`s with
their catalogue code.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import CatalogError
from raftmq.cluster.base.groups import META
from raftmq.cluster.machines.apply import group_now
from raftmq.cluster.machines.delivery import available, check_fence, refuse_new_group_over_caps, stale_receipt
from raftmq.cluster.node.messages import message_item, read_offsets
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.upgrade_gate import ensure_dlq_command, gated_fields
from raftmq.cluster.node.view import LocalGroup
from raftmq.cluster.node.waiters import until_woken
from raftmq.cluster.replication.settle_commit import SettleCommitter
from raftmq.storage import keys
from raftmq.storage.keys import STATE_INFLIGHT, PendingRecord
from raftmq.storage.queues import lock_state, queue_bounds, read_messages, redrive_offset
from raftmq.storage.store import Store

__all__ = [
    "DELIVERY_ACTIONS",
    "DeliveryActions",
    "answered_here",
    "await_available",
    "check_lock",
    "dlq_list",
    "render_taken",
]

Propose = Callable[[str, bytes], Awaitable[dict[str, Any]]]
"""Propose a command to a group led here; its result, or a :class:`RaftmqError`."""
Barrier = Callable[[str], Awaitable[dict[str, Any]]]
"""A read barrier of a group led here, shared with the reads waiting at once (``barriers.py``)."""

_STAMPED_ACTIONS = frozenset(
    {"ack", "nack", "extend", "release", "lock", "redrive", "subscribe", "touch_subscriptions"}
)
_SETTLE_ACTIONS = frozenset({"ack", "nack", "extend", "release"})
_COMMAND_ACTIONS = _STAMPED_ACTIONS | {"subscribe", "unlock", "commit_fenced"}
DELIVERY_ACTIONS = _COMMAND_ACTIONS | {"receive", "ack_receive", "await", "dlq_list", "ensure_dlq"}
"""The actions :class:`DeliveryActions` runs."""


class DeliveryActions:
    """The delivery actions of one node; :class:`~raftmq.cluster.node.actions.LeaderActions`
    hands them over."""

    def __init__(self, node: Node, propose: Propose, barrier: Barrier) -> None:
        self.node = node
        self._propose = propose
        self._barrier = barrier
        self._settlers: dict[str, SettleCommitter] = {}  # per queue group led here

    async def run(self, name: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """``action`` at this node, which leads group ``name`` (checked by the caller)."""
        propose = self._propose
        if action == "ensure_dlq":
            if name != META:
                raise CatalogError(errors.BAD_REQUEST, "ensure_dlq runs at the metadata leader")
            await self.node.await_group_supports(META, "meta.ensure_dlq_topic.records")
            return await propose(META, ensure_dlq_command(self.node, body["source"], body["group"], now_ms()))
        if name == META:
            raise CatalogError(errors.BAD_REQUEST, f"{action} runs at a queue group's leader")
        local = self.node.groups[name]
        store = local.machine.store
        if action == "receive":
            return {"messages": await self._receive(name, local, body)}
        if action == "ack_receive":
            return await self._ack_receive(name, local, body)
        if action == "await":
            ok = await await_available(
                self.node,
                name,
                body["topic_id"],
                body["group"],
                body["queues"],
                body.get("epoch"),
                body["wait_ms"] / 1000,
                body.get("ordered") is True,
                _delay_ms(body),
            )
            return {"available": ok}
        if action in _SETTLE_ACTIONS and body.get("epoch") is None:
            return {"results": await self._settle_here(name, action, body)}
        if action in _COMMAND_ACTIONS:
            # The body holds the command's fields; the leader stamps the time (for the ops that
            # take one) and checks the command before proposing it, so bad input costs no entry.
            fields = {k: v for k, v in body.items() if v is not None}
            if action in _STAMPED_ACTIONS:
                fields["now_ms"] = now_ms()
            await self.node.await_group_supports(name, "subscribe.records")  # primes gated_fields
            await self.node.await_group_supports(name, "commit_offsets.advance")
            fields = gated_fields(self.node, name, store, action, fields)
            command = orjson.dumps({"v": commands.VERSION, "op": action, **fields})
            answer = await self._answered_here(name, store, commands.decode(command))
            return answer if answer is not None else await propose(name, command)
        if action == "dlq_list":
            return dlq_list(store, body["topic_id"], body["queues"], body["max"])
        raise CatalogError(errors.NOT_FOUND, f"unknown action {action}")

    async def _answered_here(self, name: str, store: Store, cmd: commands.Command) -> dict[str, Any] | None:
        """:func:`answered_here`, given at once when :func:`_stands` says so, else confirmed after
        a read barrier of the group (shared: one entry per round trip at most): a leader cut off
        from its group still leads for up to ``leader_fallback_ms``, and its state may miss what a
        new leader acknowledged since (a newer lock granted to the consumer asking). A
        subscribe's cap check counts the group's subscriptions, a settle of many receipts reads
        each: off the event loop."""

        fields: Mapping[str, Any] = cmd  # a settle's receipts

        async def ask() -> dict[str, Any] | None:
            if cmd["op"] == "subscribe" or len(fields.get("receipts", ())) > INLINE_RECEIPTS:
                return await asyncio.to_thread(answered_here, store, cmd)
            return answered_here(store, cmd)

        try:
            answer = await ask()
        except CatalogError as e:
            if _stands(store, cmd, e):
                raise
        else:
            if answer is None or _stands(store, cmd, None):
                return answer
        await self._barrier(name)
        return await ask()

    async def _receive(self, name: str, local: LocalGroup, body: dict[str, Any]) -> list[dict[str, Any]]:
        """A ``receive`` command, proposed only when something is available; the messages it
        handed out, with their receipts."""
        store = local.machine.store
        if body.get("epoch") is not None:  # refused now, even when there is nothing to hand out
            check_lock(store, body["group"], body["topic_id"], body["queues"], body["epoch"])
        ordered = body.get("ordered") is True
        delay_ms = _delay_ms(body) if ordered else 0
        if delay_ms and not await self.node.await_group_supports(name, "receive_ordered.delay"):
            # A voter would refuse the field: nothing is handed out (a coordinator asks again
            # after this pause, not at once: its await would find the messages available).
            await asyncio.sleep(ORDERED_LOOK_S)
            return []
        ok, _ = _available(
            local,
            body["group"],
            body["topic_id"],
            body["queues"],
            group_now(store, now_ms()),
            body.get("epoch"),
            ordered,
            delay_ms,
        )
        if not ok:
            return []
        command = commands.receive(
            now_ms(),
            body["group"],
            body["topic_id"],
            body["queues"],
            body["max"],
            body["visibility_ms"],
            epoch=body.get("epoch"),
            max_age_ms=body.get("max_age_ms"),
            ordered=ordered,
            delay_ms=delay_ms or None,
        )
        return render_taken(store, body["topic_id"], await self._propose(name, command))

    async def _ack_receive(self, name: str, local: LocalGroup, body: dict[str, Any]) -> dict[str, Any]:
        """An ack that takes up to ``max`` messages of ``queues`` along (``body``: an ack's
        ``group``, ``topic_id``, ``receipts``; a receive's ``queues``, ``max``, ``visibility_ms``,
        ``max_age_ms``): one ``ack_receive`` entry when something is available and every voter
        applies it, else a plain ack through the group's settlement committer. The ack's
        ``results`` and the ``messages`` handed out (none for a plain ack)."""
        store = local.machine.store
        ack_body = {"group": body["group"], "topic_id": body["topic_id"], "receipts": body["receipts"]}
        now = group_now(store, now_ms())
        take = (
            await self.node.await_group_supports(name, "ack_receive")
            and _available(local, body["group"], body["topic_id"], body["queues"], now, None, False)[0]
        )
        if not take:
            return {"results": await self._settle_here(name, "ack", ack_body), "messages": []}
        command = commands.ack_receive(
            now_ms(),
            body["group"],
            body["topic_id"],
            [(q, o, t) for q, o, t in body["receipts"]],
            body["queues"],
            body["max"],
            body["visibility_ms"],
            max_age_ms=body.get("max_age_ms"),
        )
        commands.decode(command)  # BadCommand: the catalogue's code, nothing proposed
        result = await self._propose(name, command)
        return {"results": result["results"], "messages": render_taken(store, body["topic_id"], result)}

    async def _settle_here(self, name: str, action: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """An ack, nack or extend through the group's :class:`SettleCommitter` (concurrent
        requests share entries). Checked first, so bad input costs no entry and fails no other
        request it would have been merged with."""
        fields = {k: v for k, v in body.items() if v is not None}
        commands.validate({"v": commands.VERSION, "op": action, "now_ms": 0, **fields})
        stale = await self._all_stale(name, body["topic_id"], body["group"], body["receipts"])
        if stale is not None:
            return stale
        settler = self._settlers.get(name)
        if settler is None:
            propose = self._propose
            # As many entries in flight as a produce's group commit: with one, a second receiver's
            # ack waited a whole commit behind the first's and then went alone all the same.
            inflight = self.node.config.raft.group_commit_inflight
            settler = self._settlers[name] = SettleCommitter(lambda c: propose(name, c), now_ms, inflight)
        return await settler.settle(action, body["topic_id"], body["group"], body["receipts"], fields)

    async def _all_stale(
        self, name: str, topic_id: int, group: str, receipts: list[list[int]]
    ) -> list[dict[str, Any]] | None:
        """The apply's answer to a settle whose every receipt names nothing in flight at this
        leader (:func:`stale_results`), after a shared read barrier when a receipt's token is
        above the index this replica has applied (a newer leader, or an entry not applied here
        yet, could have handed it out); None: the settle is proposed. After the barrier (proposed
        once the settle arrived) every receive whose answer the client could hold is applied here:
        a token still above is a receive not committed when the settle came, which the settle is
        ordered before, so stale is the answer. A client sending made-up or spent receipts thus
        makes no entry (at most the barriers' one per round trip)."""
        machine = self.node.groups[name].machine

        async def ask() -> tuple[list[dict[str, Any]] | None, bool]:
            applied = machine.applied_index  # before the store's reads
            if len(receipts) > INLINE_RECEIPTS:
                return await asyncio.to_thread(
                    stale_results, machine.store, applied, topic_id, group, receipts
                )
            return stale_results(machine.store, applied, topic_id, group, receipts)

        answer, confirmed = await ask()
        if answer is None or confirmed:
            return answer
        await self._barrier(name)
        answer, _ = await ask()
        return answer


def stale_results(
    store: Store, applied: int, topic_id: int, group: str, receipts: Sequence[Sequence[int]]
) -> tuple[list[dict[str, Any]] | None, bool]:
    """What the apply of an ack, nack, extend or release of ``receipts`` answers when none is in
    flight in ``store`` under its token (``stale_receipt`` each, nothing written but the
    subscription's time in use, which a receipt holding nothing need not move), and whether that
    stands: each token at most ``applied`` (the index ``store`` had applied when asked), whose
    receive was applied here, so its delivery can never be in flight again (tokens are unique).
    (None, False): one is in flight, or the topic was dropped (the apply refuses it)."""
    if store.get(keys.dropped_key(topic_id)) is not None:
        return None, False
    results = []
    for queue, offset, token in receipts:
        data = store.get(keys.pending_key(topic_id, queue, group, offset))
        if data is not None:
            rec = PendingRecord.decode(data)
            if rec.state == STATE_INFLIGHT and rec.token == token:
                return None, False
        results.append(stale_receipt(queue, offset))
    return results, all(token <= applied for _, _, token in receipts)


def render_taken(store: Store, topic_id: int, result: dict[str, Any]) -> list[dict[str, Any]]:
    token = result["token"]
    delivered = result["messages"]
    by_queue: dict[int, list[int]] = defaultdict(list)
    for d in delivered:
        by_queue[d["queue"]].append(d["offset"])
    found = {q: read_offsets(store, topic_id, q, offsets) for q, offsets in by_queue.items()}
    out = []
    for d in delivered:
        queue, offset = d["queue"], d["offset"]
        m = found[queue].get(offset)
        if m is None:
            continue
        head = {
            "receipt": f"{topic_id}.{queue}.{offset}.{token}",  # format_receipt
            "attempt": d["attempt"],
            "queue": queue,
            "deadline_ms": d["deadline_ms"],
        }
        if "first_ms" in d:  # absent from a leader of the release before it
            head["first_delivery_ms"] = d["first_ms"]
        out.append(message_item(head, m))
    return out


def dlq_list(store: Store, topic_id: int, queues: list[int], max_messages: int) -> dict[str, Any]:
    """The action ``dlq_list`` at a queue group's leader: per queue the redrive offset and high
    offset, and up to ``max_messages`` messages from the redrive offsets on."""
    out_queues: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for q in queues:
        low, high = queue_bounds(store, topic_id, q)
        start = max(low, redrive_offset(store, topic_id, q) or 0)
        out_queues.append({"queue": q, "redrive_offset": start, "high_offset": high})
        room = max_messages - len(messages)
        if room > 0 and start < high:
            messages += [
                message_item({"queue": q}, m) for m in read_messages(store, topic_id, q, start, room)
            ]
    return {"queues": out_queues, "messages": messages}


def answered_here(store: Store, cmd: commands.Command) -> dict[str, Any] | None:
    """What the apply would answer ``cmd`` without writing anything (a refusal, raised, or a
    no-op's result), from the leader's state; None: the command is proposed (so is one of a topic
    dropped here: the apply refuses it first, ``topic_not_found``). So a request that changes
    nothing costs no Raft entry of its own: a consumer polling for a lock another holds, an
    unlock, a fenced commit or a fenced ack, nack or extend with a stale epoch or whose every
    receipt names nothing in flight (:func:`stale_results`; an unfenced one is answered before
    its settle committer, :meth:`DeliveryActions._all_stale`), a new group past the caps, a
    redrive with nothing to redrive (each was an entry, refused by the apply or changing nothing,
    before). :meth:`DeliveryActions._answered_here` gives what a newer leader
    could not have undone at once and confirms the rest after a shared read barrier
    (:func:`_stands`). The apply checks again."""
    topic_id = cmd.get("topic_id")
    if isinstance(topic_id, int) and store.get(keys.dropped_key(topic_id)) is not None:
        return None
    if cmd["op"] == "subscribe":
        refuse_new_group_over_caps(store, cmd)
    elif cmd["op"] == "lock":
        current = lock_state(store, cmd["group"], cmd["topic_id"], cmd["queue"])
        now = group_now(store, cmd["now_ms"])  # the apply's time: leases are on the group's time
        if current is not None and current.holder != cmd["consumer"] and current.live(now):
            raise CatalogError(
                errors.LOCK_HELD,
                f"queue {cmd['queue']} is locked by another consumer",
                holder=current.holder,
                lease_until_ms=current.lease_until_ms,
            )
    elif cmd["op"] == "unlock":
        current = lock_state(store, cmd["group"], cmd["topic_id"], cmd["queue"])
        if current is None or current.holder != cmd["consumer"] or current.epoch != cmd["epoch"]:
            return {"released": False}
        if current.lease_until_ms == 0:
            return {"released": True}
    elif cmd["op"] == "commit_fenced":
        check_fence(store, cmd["group"], cmd["topic_id"], sorted(cmd["offsets"]), cmd["epoch"])
    elif (cmd["op"] == "ack" or cmd["op"] == "nack" or cmd["op"] == "extend") and cmd["epoch"] is not None:
        queues = sorted({r.queue for r in cmd["receipts"]})
        check_fence(store, cmd["group"], cmd["topic_id"], queues, cmd["epoch"])
        results, _ = stale_results(store, 0, cmd["topic_id"], cmd["group"], cmd["receipts"])
        return None if results is None else {"results": results}
    elif cmd["op"] == "redrive":
        return _nothing_to_redrive(store, cmd["topic_id"], cmd["dlq_topic_id"], cmd["queues"])
    return None


def _stands(store: Store, cmd: commands.Command, error: CatalogError | None) -> bool:
    """Whether the leader's answer to ``cmd`` (``error``, or its result when None) may be given
    without a barrier. Lock epochs only grow, so these hold whatever a newer leader wrote: a lock
    epoch newer than the command's (``stale_epoch``), an unlock of a lock that has moved on to a
    newer epoch or that another consumer holds under that epoch (``{"released": false}``). These
    a client takes as "not now" and asks again: a lock another holds (``lock_held``), a new group
    past the caps (``too_many_groups``: wrong only if a group of the token expired at a new
    leader in that window), a redrive that finds nothing (one that a timer repeats; dead letters
    stored meanwhile go with the next). What would end a consumer's lock for good when a new
    leader granted it a newer one (``stale_epoch`` or an unlock against an older or missing lock
    here) is confirmed first."""
    fields: Mapping[str, Any] = cmd  # the fields these ops share (``epoch``; an unlock's lock)
    if error is not None:
        newer = error.details.get("epoch")
        return error.code in (errors.LOCK_HELD.code, errors.TOO_MANY_GROUPS.code) or (
            error.code == errors.STALE_EPOCH.code and isinstance(newer, int) and newer > fields["epoch"]
        )
    if fields["op"] == "redrive":
        return True
    if fields["op"] != "unlock":
        return False
    current = lock_state(store, fields["group"], fields["topic_id"], fields["queue"])
    epoch = fields["epoch"]
    return current is not None and (
        current.epoch > epoch or (current.epoch == epoch and current.holder != fields["consumer"])
    )


def _nothing_to_redrive(store: Store, topic_id: int, dlq: int, queues: list[int]) -> dict[str, Any] | None:
    """The apply's answer to a redrive that finds every queue's dead letters redriven already (its
    redrive offset at or past the queue's high and low offsets: nothing moved, nothing written),
    or None (``cluster/machines/delivery/dead_letters.py``; a dropped topic: the apply refuses)."""
    if any(store.get(keys.dropped_key(t)) is not None for t in (topic_id, dlq)):
        return None
    results = []
    for queue in queues:
        low, high = queue_bounds(store, dlq, queue)
        stored = redrive_offset(store, dlq, queue)
        if stored is None or stored < max(low, high):
            return None
        results.append({"queue": queue, "count": 0, "redrive_offset": stored, "high_offset": high})
    return {"queues": results, "more": False}


def check_lock(store: Store, group: str, topic_id: int, queues: list[int], epoch: int) -> None:
    """``stale_epoch`` unless each queue is locked with ``epoch`` by a live lease (as the state
    machine's receive would refuse it)."""
    now = group_now(store, now_ms())  # leases are on the group's time
    for q in queues:
        state = lock_state(store, group, topic_id, q)
        if state is None or state.epoch != epoch or not state.live(now):
            raise CatalogError(
                errors.STALE_EPOCH,
                f"queue {q} is not locked with epoch {epoch} now",
                queue=q,
                epoch=None if state is None else state.epoch,
            )


INLINE_RECEIPTS = 64
"""Receipts a leader looks up on the event loop before a settle; more are looked up off it (up to
10,000 store reads)."""

ORDERED_LOOK_S = 0.2
"""How often a wait for ``receive_ordered`` looks again: an ack that frees a message group wakes
no one (acks do not signal), so a waiting receiver sees it within this."""


def _delay_ms(body: dict[str, Any]) -> int:
    """An ordered receive's ``delay_ms`` (an SQS FIFO queue's DelaySeconds; 0: none)."""
    value = body.get("delay_ms")
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= commands.MAX_DURATION_MS:
        raise CatalogError(errors.BAD_REQUEST, "delay_ms must be a duration in milliseconds")
    return value


def _available(
    local: LocalGroup,
    group: str,
    topic_id: int,
    queues: list[int],
    now: int,
    epoch: int | None,
    ordered: bool,
    delay_ms: int = 0,
) -> tuple[bool, int | None]:
    """Whether a receive of this leader's replica ``local`` could hand out something now (and if
    not, when it may): an ordered one through the replica's kept looks (``OrderedLooks``: a look
    while nothing was applied reads nothing)."""
    machine = local.machine
    if ordered and epoch is None:
        applied = machine.applied_index  # before the store: see OrderedLooks.available
        return local.looks.available(machine.store, applied, group, topic_id, queues, now, delay_ms)
    return available(machine.store, group, topic_id, queues, now, epoch)


async def await_available(
    node: Node,
    name: str,
    topic_id: int,
    group: str,
    queues: list[int],
    epoch: int | None,
    timeout_s: float,
    ordered: bool = False,
    delay_ms: int = 0,
) -> bool:
    """Wait (at most ``timeout_s``) until a receive from this replica's queues of group ``name``
    could hand out something: the queue grew, a retry is due, a lock was released or ran out
    (``ordered``: a ``receive_ordered`` with ``delay_ms``, whose message group may also be freed
    by an ack, and whose next message may become due)."""
    deadline = time.monotonic() + timeout_s
    local = node.groups[name]
    store = local.machine.store
    with node.waiters.watch():  # before the first look: an apply after it wakes the loop
        while True:
            # Listening before the look: a wake for an apply after it is not lost (waiters.py).
            with node.waiters.listen((topic_id, q) for q in queues) as grown:
                # Due times and leases are on the group's time (cluster/machines/apply.py, advance).
                now = group_now(store, now_ms())
                ok, wake_ms = _available(local, group, topic_id, queues, now, epoch, ordered, delay_ms)
                remaining = deadline - time.monotonic()
                if ok or remaining <= 0:
                    return ok
                if wake_ms is not None:
                    remaining = min(remaining, max(0.001, (wake_ms - now) / 1000))
                if ordered:
                    remaining = min(remaining, ORDERED_LOOK_S)
                await until_woken(grown, remaining)
