"""A node's replicas follow the placement: start what is placed here, drop what was moved away.

The metadata group's placement (``cluster/machines/placement.py``) says which nodes host which groups. Every
node keeps its own replicas in line with it:

- a group placed here and not running is started as a *joining* replica (a fresh one stays quiet
  until its group's leader, which the coordinator asks to add it, reaches it);
- a group running here and no longer placed here is stopped and its data deleted, but only once the
  group's leader (another node) reports a voter set without this node. The coordinator removes a
  voter from the Raft group before it unplaces it, so this only confirms what already happened,
  and a stale view of the placement never deletes a voter's data.

The last placement seen is cached in ``<node_dir>/placement.json`` (written atomically), so a
restarted node starts the right groups before the metadata group has a leader. A node with no
cache and no data (its first start) asks its peers; only when none knows a placement is this the
cluster's first start, and the placement is computed from the cluster file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import structlog

from raftmq.cluster.base.groups import port_offset
from raftmq.cluster.machines.placement import Placement

if TYPE_CHECKING:
    from raftmq.cluster.node.view import NodeView

__all__ = ["Reconciler"]

log = structlog.get_logger(__name__)

POLL_S = 1.0


class Reconciler:
    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.cache_path = os.path.join(node.node_dir, "placement.json")
        self._wake = asyncio.Event()

    # -- start-up ---------------------------------------------------------------------------------

    async def initial_placement(self) -> Placement | None:
        """The cached placement; on a first start (nothing on disk) a peer's; None: first start of
        the cluster (the placement then comes from the cluster file)."""
        cached = self._load_cache()
        if cached is not None or self.groups_on_disk():
            return cached
        found = await self._ask_peers()
        if found is not None:
            self._save_cache(found)
            log.info("placement_from_peer", version=found.version)
        return found

    def groups_on_disk(self) -> set[str]:
        root = os.path.join(self.node.node_dir, "groups")
        try:
            return {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, "raft"))}
        except FileNotFoundError:
            return set()

    # -- the loop ---------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def run_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()
            try:
                await self.once()
            except Exception:
                log.exception("reconcile_failed")

    async def once(self) -> None:
        placement, change = await self._current()
        node = self.node
        node.change_in_progress = change
        if placement is not None and (node.placement is None or placement.version > node.placement.version):
            node.set_placement(placement)
            self._save_cache(placement)
            log.info("placement_changed", version=placement.version, groups=placement.groups_on(node.me.id))
        if node.placement is None:
            return
        placed = set(node.placement.groups_on(node.me.id))
        for name in sorted(placed - set(node.groups)):
            await node.start_group(name, joining=True)
        for name in sorted(set(node.groups) - placed):
            if await self._not_a_voter(name):
                await node.stop_group(name, delete=True)
        node.hint_peers()

    async def _current(self) -> tuple[Placement | None, dict[str, Any] | None]:
        """The newest placement (and the change in progress beside it) among this node's metadata
        replica, if any, and the other metadata replicas'. A replica removed from the metadata
        group stops receiving entries, so the local copy alone could stay stale for ever."""
        node = self.node
        answers: list[tuple[Placement, dict[str, Any] | None]] = []
        machine = node.metadata
        if machine is not None and (local := machine.placement()) is not None:
            change = machine.change()
            answers.append((local, None if change is None else change.to_json()))
            meta = node.groups.get("meta")
            if meta is not None and meta.raft.status().hears_leader:
                # The local replica leads, or its leader reached it within an election timeout:
                # it gets every placement entry, and its applies wake this loop. A replica cut
                # off, or removed without learning of it, hears no leader: then the peers are
                # asked. (An idle cluster's nodes thus ask each other nothing.)
                return answers[0]
        peers = [n for n in node.config.metadata_voters if n.id != node.me.id]
        answers += [a for a in await asyncio.gather(*(self._ask(n) for n in peers)) if a is not None]
        if len(answers) <= (machine is not None):
            # No other metadata replica answered: they may all have moved while this node was
            # down. Ask every node this node knows of (they answer from their own replicas).
            others = {n.id: n for n in (*node.config.nodes, *node.file_config.nodes) if n.id != node.me.id}
            found = await asyncio.gather(*(self._ask(n) for n in others.values() if n not in peers))
            answers += [a for a in found if a is not None]
        if not answers:
            return None, None
        return max(answers, key=lambda a: a[0].version)

    async def _ask(self, peer: Any) -> tuple[Placement, dict[str, Any] | None] | None:
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError):
            body = await self.node.peer_get_json(peer, "/internal/placement", timeout_s=2.0)
            if isinstance(body, dict) and body.get("placement") is not None:
                return Placement.from_json(body["placement"]), body.get("change")
        return None

    async def _ask_peers(self) -> Placement | None:
        peers = [n for n in self.node.file_config.nodes if n.id != self.node.me.id]
        found = [a[0] for a in await asyncio.gather(*(self._ask(n) for n in peers)) if a is not None]
        return max(found, key=lambda p: p.version, default=None)

    async def _not_a_voter(self, name: str) -> bool:
        """True when the leader of group ``name`` (another node) has a voter set without us."""
        node = self.node
        local = node.groups.get(name)
        if local is None or local.raft.is_leader():
            return False

        me = node.me.raft_addr(port_offset(name))
        statuses = await node.refresh_peer_status()
        leaders = [
            s["groups"][name] for s in statuses.values() if s.get("groups", {}).get(name, {}).get("is_leader")
        ]
        if not leaders:
            return False
        # Not compared with our own term: a removed replica, cut off, may have campaigned its term up.
        leader = max(leaders, key=lambda g: int(g["term"]))
        return me not in leader.get("members", [me])

    # -- the cache --------------------------------------------------------------------------------

    def _load_cache(self) -> Placement | None:
        try:
            with open(self.cache_path, "rb") as f:
                return Placement.from_json(orjson.loads(f.read()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("placement_cache_unreadable", path=self.cache_path)
            return None

    def _save_cache(self, placement: Placement) -> None:
        tmp = self.cache_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(placement.to_json()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.cache_path)
        fd = os.open(os.path.dirname(self.cache_path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
