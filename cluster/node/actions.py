"""The writes this node runs as a group's leader, by name: what the node's ``LeaderRouter`` runs
when this node leads the group, and what ``/internal/groups/{g}/{action}`` runs for a peer that
does not (``cluster/api/handlers/internal.py``). No HTTP here: a failure is a
:class:`RaftmqError` with its catalogue code, which the API renders.

=================  ==========================================================================
action             what the leader does
=================  ==========================================================================
``append``         checked record batches ``{"items": [(topic_id, queue, batch), ...]}`` into
                   the group committer: one binary ``append`` entry (``docs/format.md``)
``produce``        JSON batches a peer of a release before binary appends forwarded: the JSON
                   ``produce`` entry that release wrote (``cluster/replication/upgrade.py``)
``dedup_produce``  messages appended to one queue unless their deduplication key is in its
                   window (``dedup_produce``: the SQS API's FIFO queues)
``drop``           ``drop_topic`` of a deleted topic's queues
``commit``         a consumer group's offsets (``commit_offsets``)
``barrier``        a ``noop``: every earlier write is applied here once it returns (shared by
                   the barriers waiting at once: ``barriers.py``)
``topic_command``  at the metadata leader: ``create_topic``, ``set_topic_attributes``,
                   ``set_topic_tags``, ``set_topic_retention``, ``delete_topic`` (the leader
                   adds the time and the group count)
``membership``     add or remove a voter of the group (the change coordinator, ``changes.py``)
``transfer``       hand the group's leadership over
delivery           ``delivery_actions.py``
=================  ==========================================================================
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import CatalogError, ProduceFailed, RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.node.barriers import Barriers
from raftmq.cluster.node.delivery_actions import DELIVERY_ACTIONS, DeliveryActions, render_taken
from raftmq.cluster.node.node import Node, set_if_pending
from raftmq.cluster.replication.group_commit import GroupCommitter
from raftmq.cluster.replication.raft import Outcome

__all__ = ["MEMBERSHIP_TIMEOUT_S", "METADATA_INDEX", "METADATA_INDEX_HEADER", "LeaderActions", "raft_error"]

MEMBERSHIP_TIMEOUT_S = 10.0
# The leader's metadata applied index after a metadata write: in a result, and the header of a
# forwarded request's answer (cluster/api/app.py).
METADATA_INDEX = "metadata_index"
METADATA_INDEX_HEADER = "X-Raftmq-Metadata-Index"
_T = TypeVar("_T")

_TOPIC_OPS = frozenset(
    {"create_topic", "set_topic_attributes", "set_topic_tags", "set_topic_retention", "delete_topic"}
)


def raft_error(code: str, message: str, definite: bool) -> RaftmqError:
    """The error of a failed Raft proposal (``Outcome.error``)."""
    return CatalogError(errors.outcome_code(code, definite), message)


def _checked(name: str, outcome: Outcome) -> dict[str, Any]:
    """The applied result of a proposal to group ``name``; a failed proposal, or a result that is
    an error body, raises its :class:`RaftmqError`."""
    if outcome.error:
        raise raft_error(outcome.error, f"group {name}: {outcome.error}", outcome.definite)
    result: dict[str, Any] = outcome.result
    if "error" in result:
        raise CatalogError.from_body(result["error"])
    return result


class LeaderActions:
    """The actions of one node as a group's leader (one instance per node, the router's)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = node.config.limits
        timeout_s = self.limits.request_timeout_ms / 1000
        self.barriers = Barriers(lambda name, cmd: node.propose(name, cmd), commands.noop(), timeout_s)
        self.delivery = DeliveryActions(node, self.propose_checked, self.barrier)
        # How long a new leader's reads and actions wait for it to apply its term's first entry:
        # one election timeout (at least a second), after which it is no leader a client can use.
        self.read_wait_s = max(1.0, node.config.raft.election_max_ms / 1000)

    def serves_reads(self, name: str) -> bool:
        """This node leads group ``name`` and its replica holds every acknowledged write: the
        leader has applied its term's first entry (Raft's read rule, ``leader_reads.py``)."""
        local = self.node.groups.get(name)
        return local is not None and local.raft.reads.ready()

    async def reads_here(self, name: str) -> bool:
        """Whether this node answers a read of group ``name``'s state itself: True once it serves
        reads (:meth:`serves_reads`), False when it does not lead the group (the leader answers).
        A leader that has not applied its term's first entry yet (just elected) is waited for, up
        to ``read_wait_s``, then refused: 503 ``unavailable``, retriable (nothing was read)."""
        deadline = time.monotonic() + self.read_wait_s
        pause = 0.005  # doubled up to 50 ms: many requests wait at once after an election
        while not self.serves_reads(name):
            local = self.node.groups.get(name)
            if local is None or not local.raft.is_leader():
                return False
            if time.monotonic() >= deadline:
                message = f"group {name}: its new leader {self.node.me.id} has not applied its first entry"
                raise CatalogError(errors.UNAVAILABLE, message + " yet")
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.05)
        return True

    async def propose_checked(self, name: str, command: bytes) -> dict[str, Any]:
        """Propose ``command`` to group ``name`` (led here) and return its applied result; a
        failed proposal, or a result that is an error body, raises its :class:`RaftmqError`."""
        return _checked(name, await self.node.propose(name, command))

    async def barrier(self, name: str) -> dict[str, Any]:
        """A read barrier of group ``name`` (led here): a ``noop`` proposed after this call,
        shared with the other reads of the group waiting at the same time (``barriers.py``)."""
        return _checked(name, await self.barriers.wait(name))

    async def run(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None = None
    ) -> dict[str, Any]:
        """``action`` at this node as leader of group ``name`` (``not_leader`` when it is not).

        The result of a metadata action carries ``metadata_index``, the leader's applied index
        after it: the node that passed the call on waits for its own replica to reach it
        (:meth:`LeaderRouter.group_call`)."""
        # Its state first holds every acknowledged write: the checks an action makes before it
        # proposes (a lock's epoch, what a receive finds, a dead-letter list) read it.
        if not await self.reads_here(name):
            raise CatalogError(errors.NOT_LEADER, f"{self.node.me.id} does not lead group {name}")
        result = await self._run(name, action, body, size_hint)
        if name == META and self.node.metadata is not None:
            result = {**result, METADATA_INDEX: self.node.metadata.applied_index}
        return result

    async def _run(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None
    ) -> dict[str, Any]:
        if action == "append" or action == "produce":
            return await self._produce(name, action, body, size_hint)
        if action == "dedup_produce":
            command = commands.dedup_produce(now_ms(), body["topic_id"], body["queue"], body["messages"])
            commands.decode(command)  # BadCommand: the catalogue's code, nothing proposed
            return await self.propose_checked(name, command)
        if action == "drop":
            return await self.propose_checked(name, commands.drop_topic(int(body["topic_id"])))
        if action == "commit":
            offsets = {int(k): v for k, v in body["offsets"].items()}
            # advance only once every voter applies it (docs/operations.md, rolling upgrades): until
            # then the commit is written as a set, as before the field.
            advance = body.get("advance") is True and await self.node.await_group_supports(
                name, "commit_offsets.advance"
            )
            return await self.propose_checked(
                name, commands.commit_offsets(body["group"], int(body["topic_id"]), offsets, advance=advance)
            )
        if action == "barrier":
            return await self.barrier(name)
        if action == "topic_command" and name == META:
            # A compare-and-set only once every metadata voter applies it: an older replica would
            # ignore expect and merge where the others refuse (docs/operations.md, rolling upgrades).
            if body.get("expect") is not None and not await self.node.await_group_supports(
                META, "meta.set_topic_attributes.expect"
            ):
                message = "a metadata voter does not apply set_topic_attributes.expect yet"
                raise CatalogError(errors.UPGRADE_IN_PROGRESS, message + " (a rolling upgrade)")
            return await self.propose_checked(META, self._topic_command(body))
        if action == "transfer" or action == "membership":
            return await self._voters(name, action, body)
        if action in DELIVERY_ACTIONS:
            return await self.delivery.run(name, action, body)
        raise CatalogError(errors.NOT_FOUND, f"unknown action {action}")

    async def _produce(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None
    ) -> dict[str, Any]:
        committer = self.node.groups[name].committer
        if committer is None:
            raise CatalogError(errors.BAD_REQUEST, "not a queue group")
        take = body.get("take")
        if action == "append" and take is not None:  # append.take, for a receive waiting here
            return await self._append_taking(name, committer, body["items"], take, size_hint)
        if action == "append":  # binary batches: body {"items": [(topic_id, queue, batch), ...]}
            size = size_hint if size_hint is not None else sum(len(item[2]) for item in body["items"])
            proposal = committer.append(body["items"], size)
        else:
            size = size_hint if size_hint is not None else len(orjson.dumps(body["batches"]))
            proposal = committer.produce(body["batches"], size)
        return {"results": await self._committed(name, proposal)}

    async def _append_taking(
        self,
        name: str,
        committer: GroupCommitter,
        items: list[Any],
        take: dict[str, Any],
        size_hint: int | None,
    ) -> dict[str, Any]:
        """An ``append`` whose entry takes messages along (``take``: the fields of the field level
        ``append.take``, written only once every voter applies it; else a plain append): its
        ``results`` and the ``messages`` handed out, rendered as a receive's."""
        size = size_hint if size_hint is not None else sum(len(item[2]) for item in items)
        if not self.node.group_supports(name, "append.take"):
            return {"results": await self._committed(name, committer.append(items, size)), "messages": []}
        results, taken = await self._committed(name, committer.append_taking(items, size, take))
        store = self.node.groups[name].machine.store
        return {"results": results, "messages": render_taken(store, take["topic_id"], taken)}

    async def _committed(self, name: str, proposal: Awaitable[_T]) -> _T:
        """``proposal``'s outcome within the request timeout, its failures as the catalogue's."""
        try:
            # A timeout scope, not wait_for: the proposal runs in this task (no task per request).
            async with asyncio.timeout(self.limits.request_timeout_ms / 1000):
                return await proposal
        except TimeoutError:
            raise CatalogError(errors.TIMEOUT, f"queue group {name} did not commit in time") from None
        except ProduceFailed as e:
            raise CatalogError(e.error, f"queue group {name}: {e}") from None

    def _topic_command(self, body: dict[str, Any]) -> bytes:
        """The metadata command of ``topic_command`` (``body``: the op and its fields; the leader
        adds the time and the group count of a ``create_topic``). The metadata machine checks the
        fields."""
        op = body.get("op")
        if op not in _TOPIC_OPS:
            raise CatalogError(errors.BAD_REQUEST, f"topic_command cannot run {op!r}")
        command = {**body, "v": 1}
        if op == "create_topic":
            command.update(now_ms=now_ms(), group_count=self.node.config.queue_groups)
        return orjson.dumps(command)

    async def _voters(self, name: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """Change the group's voters (``membership``: ``{"action": "add" | "remove", "addr"}``),
        or hand its leadership over (``transfer``: ``{"to": raft address or null}``)."""
        local = self.node.groups[name]
        if action == "transfer":
            to = body.get("to")
            if to is not None and not isinstance(to, str):
                raise CatalogError(errors.BAD_REQUEST, "'to' must be a Raft address or null")
            local.raft.transfer_leadership(to)
            return {"ok": True}
        what, addr = body.get("action"), body.get("addr")
        if what not in ("add", "remove") or not isinstance(addr, str):
            raise CatalogError(
                errors.BAD_REQUEST, 'body must be {"action": "add" | "remove", "addr": "<host:port>"}'
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()

        def done(outcome: Outcome) -> None:  # tick thread
            loop.call_soon_threadsafe(set_if_pending, future, outcome)

        local.raft.change_membership(what, addr, done)
        try:
            outcome = await asyncio.wait_for(future, MEMBERSHIP_TIMEOUT_S)
        except TimeoutError:
            message = f"group {name}: the voter change did not commit in time"
            raise CatalogError(errors.TIMEOUT, message) from None
        if outcome.error:
            code = errors.outcome_code(outcome.error, outcome.definite)
            raise CatalogError(code, f"group {name}: {what} {addr}: {outcome.error}")
        result: dict[str, Any] = outcome.result
        return result
