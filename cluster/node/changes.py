"""The coordinator: drives the cluster change in progress to its end, one step at a time.

Every node runs one; only the metadata group's leader acts. The change and its phase live in the
metadata group (``cluster/machines/placement.py``), so when the leader crashes or hands over, the next
leader's coordinator continues from the recorded phase. Every step is idempotent and first checks
what it would change (a voter already added, a replica already unplaced), so a step interrupted
half-way is simply run again.

Moving group ``g``'s replica from ``source`` to ``target`` (also each step of removing a node)::

    start     place target in g's replicas, right after source (target's reconciler starts a
              quiet, joining replica)
    add       the leader of g adds target as a voter (single-server change, committed)
    catch_up  wait until target has applied what g's leader had committed when this phase began
    remove    move leadership off source if it leads g; the leader removes source as a voter;
              unplace source (its reconciler then deletes its replica)

When ``source`` does not answer at ``start`` (a dead node), the order is remove-first instead
(``evict`` → ``add`` → ``catch_up``): adding first would make a catching-up target part of every
quorum while a voter is already missing, and writes would stall until it caught up.

Leadership moves (``transfer_leader``) make the target the preferred leader first, so the leader
balancer keeps it there, then ask the current leader to hand over.

A ``rebalance`` is a sequence of such moves, like a node removal: between moves (``group`` None)
the coordinator asks ``cluster/machines/rebalance.py`` for the next one, from the placement as recorded,
and once none is left it reorders replicas (``prefer_leader``, phase ``leaders``) to spread the
preferred leaders; the leader balancer hands the leadership over after the change ends. A cancelled
rebalance (or node removal) rolls back the move under way, like a cancelled move, and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import structlog

from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.base.groups import META, port_offset
from raftmq.cluster.config.cluster_file import NodeConfig
from raftmq.cluster.machines.placement import Change, Placement, command, pick_target, static_placement
from raftmq.cluster.machines.rebalance import next_leader_change, next_move

if TYPE_CHECKING:
    from raftmq.cluster.node.node import Node
    from raftmq.cluster.node.router import LeaderRouter

__all__ = ["Coordinator"]

log = structlog.get_logger(__name__)

LOOP_S = 0.3  # between steps of a change in progress, at the metadata group's leader
# Otherwise (no change, or not the leader) the loop looks this often: a change begun through the
# API wakes it at once, so this bounds only how soon a new metadata leader continues one.
IDLE_LOOP_S = 1.0
CATCH_UP_WAIT_S = 10.0  # per round; the round repeats until the target caught up
TRANSFER_ATTEMPTS = 30  # rounds of a transfer_leader change before it ends as failed


class StepFailed(RaftmqError):
    """A step could not run now; the next round tries again."""


class Coordinator:
    def __init__(self, node: Node, router: LeaderRouter) -> None:
        self.node = node
        self.router = router
        self._goals: dict[tuple[int, str], int] = {}  # (change id, group) -> commit index to reach
        self._attempts: dict[int, int] = {}
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def wait_s(self) -> float:
        """How long the loop waits for a wake-up before its next look (``LOOP_S`` while this node
        leads the metadata group and a change is in progress or no placement is recorded yet)."""
        local, machine = self.node.groups.get(META), self.node.metadata
        if local is None or machine is None or not local.raft.is_leader():
            return IDLE_LOOP_S
        busy = machine.placement() is None or machine.change() is not None
        return LOOP_S if busy else IDLE_LOOP_S

    async def run_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.wait_s()):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.once()
            except (StepFailed, RaftmqError) as e:
                log.info("change_step_waiting", reason=str(e) or type(e).__name__)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("change_step_failed")
                await asyncio.sleep(1.0)

    async def once(self) -> None:
        local = self.node.groups.get(META)
        machine = self.node.metadata
        if local is None or machine is None or not local.raft.is_leader():
            return
        if machine.placement() is None:
            seed = static_placement(self.node.file_config)
            await self._propose("init_placement", placement=seed.to_json())
            log.info("placement_initialised", version=seed.version)
            return
        change = machine.change()
        if change is not None:
            await self._step(change, self._placement())

    # -- steps ------------------------------------------------------------------------------------

    async def _step(self, change: Change, placement: Placement) -> None:
        c = change.id
        if change.cancel:
            await self._cancel_step(change, placement)
        elif change.kind == "add_node":
            assert change.new_node is not None
            await self._propose("add_node", change_id=c, node=change.new_node.to_json())
            await self._end(change, "done")
        elif change.kind == "transfer_leader":
            await self._transfer_step(change)
        elif change.kind == "move":
            if await self._move_step(change, placement):
                await self._end(change, "done")
        elif change.kind in ("remove_node", "rebalance"):
            if change.group is None and change.kind == "rebalance":
                await self._next_rebalance_step(change, placement)
            elif change.group is None:
                await self._next_move(change, placement)
            elif await self._move_step(change, placement):
                await self._propose(
                    "change_phase", change_id=c, phase="next", group=None, source=None, target=None
                )

    async def _cancel_step(self, change: Change, placement: Placement) -> None:
        """Roll a cancelled change back as far as it can go, then end it as failed. A move whose
        target has caught up and whose source is being removed is finished instead."""
        if change.kind not in ("move", "remove_node", "rebalance") or change.group is None:
            await self._end(change, "failed", "cancelled")
            return
        g, source, target = change.group, change.source, change.target
        assert source is not None and target is not None
        if change.phase == "remove":
            if await self._move_step(change, placement):
                await self._end(change, "failed", f"cancelled after group {g} moved to {target}")
            return
        if target in placement.replicas(g):  # the target may be dead: why moves get cancelled
            await self._remove_voter(g, target)
            await self._propose("unplace_replica", change_id=change.id, group=g, node=target)
        left = self._placement().replicas(g)
        note = (
            "" if source in left else f"; group {g} is left with {len(left)} replicas ({source} was removed)"
        )
        await self._end(change, "failed", "cancelled" + note)

    async def _next_move(self, change: Change, placement: Placement) -> None:
        assert change.node is not None
        hosted = sorted(placement.groups_on(change.node), key=lambda g: (g == META, g.zfill(4)))
        if not hosted:
            await self._propose("remove_node", change_id=change.id, node=change.node)
            await self._end(change, "done")
            return
        group = hosted[0]
        target, exclude = None, {change.node}
        while (candidate := pick_target(placement, group, exclude)) is not None:
            if await self._answers(candidate):  # the least loaded node that is up
                target = candidate
                break
            exclude.add(candidate)
        if target is None:
            raise StepFailed(f"no running node can take group {group} from {change.node}")
        log.info("remove_node_moving", node=change.node, group=group, target=target)
        await self._propose(
            "change_phase", change_id=change.id, phase="start", group=group, source=change.node, target=target
        )

    async def _next_rebalance_step(self, change: Change, placement: Placement) -> None:
        """Between moves of a rebalance: start the next move, else make the next preferred-leader
        change, else end. Each follows from the placement alone (``cluster/machines/rebalance.py``)."""
        c = change.id
        unavailable = await self.unanswering(placement)
        move = next_move(placement, unavailable)
        if move is not None:
            log.info("rebalance_moving", group=move.group, source=move.source, target=move.target)
            await self._propose("change_phase", change_id=c, phase="start", **move.to_json())
        elif (lead := next_leader_change(placement, unavailable)) is not None:
            if change.phase != "leaders":
                await self._propose("change_phase", change_id=c, phase="leaders")
            await self._propose("prefer_leader", change_id=c, group=lead.group, node=lead.target)
            log.info("rebalance_preferred_leader", group=lead.group, source=lead.source, target=lead.target)
        else:
            await self._end(change, "done")
            return
        self.wake()

    async def unanswering(self, placement: Placement) -> frozenset[str]:
        """The nodes of ``placement`` that do not answer now (a rebalance moves nothing to them)."""
        ids = [n.id for n in placement.nodes]
        answers = await asyncio.gather(*(self._answers(i) for i in ids))
        return frozenset(i for i, ok in zip(ids, answers, strict=True) if not ok)

    async def _move_step(self, change: Change, placement: Placement) -> bool:
        """One phase of a replica move; True once the move is complete."""
        c, g, source, target = change.id, change.group, change.source, change.target
        assert g is not None and source is not None and target is not None
        phase = change.phase
        if phase == "start":
            await self._propose("place_replica", change_id=c, group=g, node=target, after=source)
            alive = await self._answers(source)
            await self._propose("change_phase", change_id=c, phase="add" if alive else "evict")
            log.info("move_started", group=g, source=source, target=target, source_alive=alive)
        elif phase == "evict":
            await self._remove_voter(g, source)
            await self._propose("unplace_replica", change_id=c, group=g, node=source)
            await self._propose("change_phase", change_id=c, phase="add")
        elif phase == "add":
            await self._membership(g, "add", target)
            await self._propose("change_phase", change_id=c, phase="catch_up")
        elif phase == "catch_up":
            if not await self._wait_caught_up(c, g, target):
                log.warning("move_target_not_a_voter", group=g, target=target)
                await self._propose("change_phase", change_id=c, phase="add")  # add it (again)
                return False
            if source not in placement.replicas(g):
                return True  # remove-first: the source is gone already
            await self._propose("change_phase", change_id=c, phase="remove")
        elif phase == "remove":
            await self._remove_voter(g, source)
            await self._propose("unplace_replica", change_id=c, group=g, node=source)
            log.info("move_done", group=g, source=source, target=target)
            return True
        else:
            raise StepFailed(f"unknown phase {phase!r}")
        self.wake()
        return False

    async def _transfer_step(self, change: Change) -> None:
        c, g, target = change.id, change.group, change.target
        assert g is not None and target is not None
        if change.phase == "start":
            await self._propose("prefer_leader", change_id=c, group=g, node=target)
            await self._propose("change_phase", change_id=c, phase="transfer")
            self.wake()
            return
        if await self._leader_id(g) == target:
            await self._end(change, "done")
            return
        attempts = self._attempts[c] = self._attempts.get(c, 0) + 1
        if attempts > TRANSFER_ATTEMPTS:
            await self._end(change, "failed", f"{target} did not take the leadership of group {g}")
            return
        await self._transfer(g, target)
        await self._wait_leader(g, lambda leader: leader == target, 5.0)

    # -- helpers ----------------------------------------------------------------------------------

    async def _remove_voter(self, g: str, source: str) -> None:
        if await self._leader_id(g) == source:
            await self._transfer(g, None)  # to the most caught-up voter (the target may be none yet)
            if not await self._wait_leader(g, lambda leader: leader not in (None, source), 5.0):
                raise StepFailed(f"{source} still leads group {g}")
        await self._membership(g, "remove", source)

    async def _membership(self, g: str, action: str, node_id: str) -> None:
        addr = self._raft_addr(node_id, g)
        result = await self.router.group_call(g, "membership", {"action": action, "addr": addr})
        log.info("voters_changed", group=g, action=action, node=node_id, members=result.get("members"))

    async def _transfer(self, g: str, node_id: str | None) -> None:
        to = None if node_id is None else self._raft_addr(node_id, g)
        await self.router.group_call(g, "transfer", {"to": to})

    async def _wait_caught_up(self, change_id: int, g: str, target: str) -> bool:
        """Wait (a round) until ``target`` applied what ``g``'s leader had committed when this
        phase began; False when ``target`` is not a voter of ``g`` (the phase must go back)."""
        leader = await self._leader_status(g)
        if leader is None:
            raise StepFailed(f"group {g} has no leader")
        if self._raft_addr(target, g) not in leader.get("members", []):
            return False
        goal = self._goals.get((change_id, g))
        if goal is None:
            goal = self._goals[(change_id, g)] = int(leader["commit_index"])
        deadline = time.monotonic() + CATCH_UP_WAIT_S
        while True:
            status = await self._status(target)
            applied = (status or {}).get("groups", {}).get(g, {}).get("applied_index", 0)
            if applied >= goal:
                log.info("replica_caught_up", group=g, node=target, applied_index=applied)
                return True
            if time.monotonic() > deadline:
                raise StepFailed(f"{target} has applied {applied} of group {g}, waiting for {goal}")
            await asyncio.sleep(0.2)

    async def _wait_leader(self, g: str, ok: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok(await self._leader_id(g)):
                return True
            await asyncio.sleep(0.2)
        return False

    async def _leader_status(self, g: str) -> dict[str, Any] | None:
        """The status of group ``g`` at the node claiming its leadership with the highest term,
        with that node's id as ``node_id``."""
        statuses = {self.node.me.id: self.node.local_status(), **await self.node.refresh_peer_status()}
        leaders = [
            {**s["groups"][g], "node_id": node_id}
            for node_id, s in statuses.items()
            if s["groups"].get(g, {}).get("is_leader")
        ]
        return max(leaders, key=lambda s: int(s["term"]), default=None)

    async def _leader_id(self, g: str) -> str | None:
        status = await self._leader_status(g)
        return None if status is None else str(status["node_id"])

    async def _status(self, node_id: str) -> dict[str, Any] | None:
        if node_id == self.node.me.id:
            return self.node.local_status()
        peer = self._peer(node_id)
        if peer is None:
            return None
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError, ValueError):
            status: dict[str, Any] = await self.node.peer_get_json(peer, "/internal/status", timeout_s=2.0)
            return status
        return None

    async def _answers(self, node_id: str) -> bool:
        return await self._status(node_id) is not None

    def _raft_addr(self, node_id: str, g: str) -> str:
        peer = self._peer(node_id)
        if peer is None:
            raise StepFailed(f"node {node_id} is not in the placement")
        return peer.raft_addr(port_offset(g))

    def _peer(self, node_id: str) -> NodeConfig | None:
        """The node as this node knows it, else from the placement (just added, not yet seen)."""
        known = self.node.node_by_id(node_id)
        if known is not None:
            return known
        addr = self._placement().node(node_id)
        if addr is None:
            return None
        me = self.node.me
        return NodeConfig(addr.id, addr.http, addr.raft, "", tls_cert_file=me.tls_cert_file)

    def _placement(self) -> Placement:
        assert self.node.metadata is not None
        placement = self.node.metadata.placement()
        assert placement is not None
        return placement

    async def _propose(self, op: str, **fields: Any) -> dict[str, Any]:
        outcome = await self.node.propose(META, orjson.dumps(command(op, **fields)))
        if outcome.error:
            raise StepFailed(f"{op}: {outcome.error}")
        result: dict[str, Any] = outcome.result
        if "error" in result:
            raise StepFailed(f"{op}: {result['error']['message']}")
        return result

    async def _end(self, change: Change, outcome: str, error: str | None = None) -> None:

        await self._propose("end_change", change_id=change.id, now_ms=now_ms(), outcome=outcome, error=error)
        self._attempts.pop(change.id, None)
        log.info("change_ended", change_id=change.id, kind=change.kind, outcome=outcome, error=error)
