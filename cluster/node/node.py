"""One raftmq node: the Raft groups placed on it, their stores, and its view of the cluster.

Layout on disk (``<data_dir>/<node_id>/``)::

    groups/meta/{state,raft,snapshot/}   the metadata group's replica (if this node is a voter)
    groups/<g>/{state,raft,snapshot/}    queue group g's replica (if placed here)
    placement.json                       the last placement this node saw (cluster/node/reconcile.py)
    tmp/                                 checkpoint transfers

Placement: ``config`` is the cluster file overlaid with the metadata group's placement (nodes and
replicas per group); it is replaced, never mutated, when the placement changes. ``file_config`` is
the cluster file as loaded. The groups hosted here follow the placement (``cluster/node/reconcile.py``);
``groups`` is likewise replaced, never mutated, so loops iterating it across awaits stay valid.

Raft ports: the metadata group listens on the node's ``raft`` port, queue group ``g`` on port+1+g.

Threads: the asyncio loop (HTTP) and one tick thread per Raft group. Tick threads reach the loop
only through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tarfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import structlog

from raftmq.cluster import commands
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.groups import META, group_sort_key, port_offset
from raftmq.cluster.commands.producers import expire_producers
from raftmq.cluster.config.cluster_file import ClusterConfig, NodeConfig
from raftmq.cluster.config.keys import NO_REDIRECTS, PEER_HEADER, derive_keys
from raftmq.cluster.config.tls import client_context
from raftmq.cluster.machines import producers
from raftmq.cluster.machines.delivery import WAKE_WITHIN_MS
from raftmq.cluster.machines.metadata import MetadataMachine, Topic
from raftmq.cluster.machines.metadata import applied_index as metadata_applied_index
from raftmq.cluster.machines.placement import Placement, overlay
from raftmq.cluster.machines.queue_group import Applied, QueueGroupMachine
from raftmq.cluster.node.reconcile import Reconciler
from raftmq.cluster.node.sealer import Sealer
from raftmq.cluster.node.view import LocalGroup
from raftmq.cluster.replication.group_commit import GroupCommitter
from raftmq.cluster.replication.raft import Outcome, RaftGroup, RaftSettings, StateMachine
from raftmq.storage.queues import applied_index as queues_applied_index
from raftmq.storage.queues import next_due_ms
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Store

__all__ = ["CheckpointBehind", "LocalGroup", "Node", "set_if_pending"]

log = structlog.get_logger(__name__)

PROBE_MAX_BYTES = 64 * 1024  # an answer read from an address that came from a request


class Node:
    """A raftmq node. ``start``/``stop`` run on the event loop."""

    def __init__(self, config: ClusterConfig, node_id: str) -> None:
        self.file_config = config
        self.config = config
        self.placement: Placement | None = None  # None: the first placement, from the cluster file
        self.change_in_progress: dict[str, Any] | None = None  # as last seen (leader balancing waits)
        self.reconciler: Reconciler | None = None  # set by start
        self.me = config.node(node_id)
        self.keys = derive_keys(config.secret)  # the only use of the raw secret (cluster/config/keys.py)
        self.node_dir = self.me.node_dir()
        self.groups: dict[str, LocalGroup] = {}
        self.metadata: MetadataMachine | None = None
        self._addr_to_node: dict[str, NodeConfig] = {}
        self._set_config(config)
        self._waiters: dict[tuple[int, int], list[asyncio.Future[None]]] = defaultdict(list)
        self._delivery_wake = asyncio.Event()  # an apply scheduled a delayed message or deadline
        # Dead letters parked for want of a dead-letter topic, (topic_id, topic, consumer group),
        # on the event loop (SubscriptionsApi.on_parked creates the topic where this node leads).
        self.on_parked: Callable[[tuple[tuple[int, str, str], ...]], None] | None = None
        self._scheduled_seq = 0  # counts those applies (on the event loop)
        # Per led queue group: (applied index, _scheduled_seq, now_ms) at its last look at the
        # schedule, and the due time it found (deliver_once's cache).
        self._due_cache: dict[str, tuple[int, int, int, int | None]] = {}
        # Per queue group: retain ticks this node proposed whose time jumped too far ahead.
        self.retention_clock_jumps: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None  # carries the peer key: known nodes only
        self._probe_session: aiohttp.ClientSession | None = None  # no credential: addresses from requests
        self._peer_status: dict[str, dict[str, Any]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self.sealer: Sealer | None = None  # segment sealing (cluster/machines/segments.py), set by start
        self.ssl_context = client_context(config)  # peer calls over HTTPS (None: plain HTTP)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def peer_session(self) -> aiohttp.ClientSession | None:
        """The session of calls to known nodes (it carries the peer key); None before ``start``."""
        return self._session

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        os.makedirs(os.path.join(self.node_dir, "tmp"), exist_ok=True)
        shutil.rmtree(os.path.join(self.node_dir, "tmp"), ignore_errors=True)
        os.makedirs(os.path.join(self.node_dir, "tmp"), exist_ok=True)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl_context or True),
            headers={PEER_HEADER: self.keys.peer},
            trust_env=False,  # no proxy from the environment: a proxy would see the key
            # sock_connect: a peer that is cut off fails fast (and definitely: nothing was sent),
            # so the request is retried at the new leader instead of hanging.
            timeout=aiohttp.ClientTimeout(
                total=self.config.limits.request_timeout_ms / 1000 + 20, sock_connect=1.0
            ),
        )
        # Invariant: a request that names an address (a node to add) is answered by calls on this
        # session only; it has no credential headers, no cookies kept between calls, no proxy.
        self._probe_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl_context or True),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )

        self.reconciler = reconciler = Reconciler(self)
        placement = await reconciler.initial_placement()
        if placement is not None:
            self.set_placement(placement)
        # The groups placed here, and any replica left on disk (the reconciler removes it once its
        # group's leader confirms it is no longer a voter).
        placed = {META} if any(v.id == self.me.id for v in self.config.metadata_voters) else set()
        placed |= {str(g) for g in self.config.groups_on(self.me.id)}
        on_disk = reconciler.groups_on_disk()
        for name in sorted(placed | on_disk, key=group_sort_key):
            # With a known placement a replica without data joins a running group; without one,
            # this is the cluster's first start (every replica must campaign).
            await self.start_group(name, joining=placement is not None and name not in on_disk)
        self._tasks.append(asyncio.create_task(reconciler.run_forever()))
        self._tasks.append(asyncio.create_task(self._balance_leaders_forever()))
        self._tasks.append(asyncio.create_task(self._retention_forever()))
        self._tasks.append(asyncio.create_task(self._deliver_forever()))
        self.sealer = Sealer(self)
        self._tasks.append(asyncio.create_task(self.sealer.run_forever()))
        log.info("node_started", node_id=self.me.id, groups=sorted(self.groups))

    async def start_group(self, name: str, *, joining: bool) -> LocalGroup:
        """Open and start this node's replica of group ``name`` (``joining``: a fresh replica of a
        running group waits for its leader instead of campaigning)."""
        assert self._loop is not None and name not in self.groups
        store = RocksStore.open(self._group_dir(name, "state"))
        machine: MetadataMachine | QueueGroupMachine
        if name == META:
            machine = MetadataMachine(store)
            machine.on_placement_changed = self._on_placement_changed
        else:
            machine = QueueGroupMachine(store, int(name))
            machine.on_applied = self._on_applied
        # The seed voters count only while the group's log holds no configuration (a new group).
        seed = [n.raft_addr(port_offset(name)) for n in self._replicas(name)]
        local = await self._loop.run_in_executor(None, self._start_group, name, seed, machine, store, joining)
        if isinstance(machine, MetadataMachine):
            self.metadata = machine
        else:
            local.committer = GroupCommitter(
                local.raft,
                self._loop,
                now_ms=now_ms,
                max_entry_bytes=self.config.raft.group_commit_bytes,
                max_inflight=self.config.raft.group_commit_inflight,
                ack_before_replication=self.config.faults.ack_before_replication,
            )
        self.groups = {**self.groups, name: local}
        local.raft.hint_peers(seed)
        log.info("group_started", group=name, node_id=self.me.id, joining=joining)
        return local

    async def stop_group(self, name: str, *, delete: bool) -> None:
        """Stop this node's replica of group ``name``; ``delete`` removes its data too."""
        local = self.groups.get(name)
        if local is None:
            return
        self.groups = {k: v for k, v in self.groups.items() if k != name}
        if name == META:
            self.metadata = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, local.raft.destroy)
        await asyncio.sleep(1.0)  # requests that still hold the stores finish (they fail once closed)
        local.state_store.close()
        local.journal_store.close()
        if delete:
            await loop.run_in_executor(None, shutil.rmtree, os.path.join(self.node_dir, "groups", name))
        log.info("group_stopped", group=name, node_id=self.me.id, deleted=delete)

    def hint_peers(self) -> None:
        """Point every local replica at its group's replicas as the placement says (see
        :meth:`RaftGroup.hint_peers`): a replica that missed a voter change still hears the leader."""
        for name, local in self.groups.items():
            local.raft.hint_peers(n.raft_addr(port_offset(name)) for n in self._replicas(name))

    def _replicas(self, name: str) -> tuple[NodeConfig, ...]:
        replicas = self.config.metadata_voters if name == META else self.config.group_replicas(int(name))
        return replicas if any(r.id == self.me.id for r in replicas) else (*replicas, self.me)

    def _start_group(
        self, name: str, seed: list[str], machine: StateMachine, store: RocksStore, joining: bool
    ) -> LocalGroup:
        journal_store = RocksStore.open(self._group_dir(name, "raft"))
        timing = self.config.raft
        settings = RaftSettings(
            password=self.keys.raft,
            fsync=self.config.durability == "fsync",
            election_min_s=timing.election_min_ms / 1000,
            election_max_s=timing.election_max_ms / 1000,
            heartbeat_s=timing.heartbeat_ms / 1000,
            leader_fallback_s=timing.leader_fallback_ms / 1000,
            compaction_min_entries=timing.compaction_min_entries,
            compaction_min_time_s=timing.compaction_min_time_s,
            compaction_max_bytes=timing.compaction_max_bytes,
            max_entry_bytes=self.config.limits.max_request_bytes + 64 * 1024,
            crash_after_snapshot=self.config.faults.crash_after_snapshot,
        )
        raft = RaftGroup(
            name=name,
            node_id=self.me.id,
            self_addr=self.me.raft_addr(port_offset(name)),
            peer_addrs=seed,
            journal_store=journal_store,
            machine=machine,
            snapshot_file=os.path.join(self._group_dir(name, "snapshot"), "manifest.json"),
            settings=settings,
            fetch_checkpoint=lambda manifest: self._fetch_checkpoint(name, manifest),
            bind_addr=self.me.raft_bind_addr(port_offset(name)),  # pysyncobj's default is 0.0.0.0
            joining=joining,
        )
        return LocalGroup(name, raft, machine, store, journal_store)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        loop = asyncio.get_running_loop()
        for local in list(self.groups.values()):
            await loop.run_in_executor(None, local.raft.destroy)
            local.state_store.close()
            local.journal_store.close()
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()
        log.info("node_stopped", node_id=self.me.id)

    def _group_dir(self, name: str, part: str) -> str:
        return os.path.join(self.node_dir, "groups", name, part)

    # -- cluster view ----------------------------------------------------------------------------

    def set_placement(self, placement: Placement) -> None:
        """Take a newer placement: the node list and replicas of ``config`` follow it."""
        self.placement = placement
        self._set_config(overlay(self.file_config, placement, self.me.id))

    def _set_config(self, config: ClusterConfig) -> None:
        addrs = {n.raft_addr(o): n for n in config.nodes for o in range(config.queue_groups + 1)}
        self._addr_to_node, self.config = addrs, config

    def _on_placement_changed(self) -> None:  # tick thread of the metadata group
        if self._loop is not None and self.reconciler is not None:
            self._loop.call_soon_threadsafe(self.reconciler.wake)

    def node_for_addr(self, raft_addr: str | None) -> NodeConfig | None:
        return None if raft_addr is None else self._addr_to_node.get(raft_addr)

    def node_by_id(self, node_id: str) -> NodeConfig | None:
        return next((n for n in self.config.nodes if n.id == node_id), None)

    def queue_group(self, group_id: int) -> LocalGroup | None:
        return self.groups.get(str(group_id))

    def leader_of(self, name: str) -> NodeConfig | None:
        """The node leading group ``name`` as far as this node knows (None: unknown).

        The local replica's view first; when it knows no leader (it is not hosted here, or it is
        electing, cut off, or a removed voter that never learnt of its removal and campaigns while
        the others go on), the peer claiming the leadership with the highest term in the last
        peer statuses fetched (:meth:`refresh_peer_status`)."""
        local = self.groups.get(name)
        if local is not None:
            leader = self.node_for_addr(local.raft.leader())
            if leader is not None:
                return leader
        claims = [
            (int(g.get("term", 0)), str(status["node_id"]))
            for status in self._peer_status.values()
            if (g := status.get("groups", {}).get(name)) and g.get("is_leader")
        ]
        return self.node_by_id(max(claims)[1]) if claims else None

    def local_status(self) -> dict[str, Any]:
        groups = {}
        for name, local in self.groups.items():
            s = local.raft.status()
            leader = self.node_for_addr(s.leader)
            groups[name] = {
                "leader": leader.id if leader else None,
                "is_leader": s.is_leader,
                "term": s.term,
                "commit_index": s.commit_index,
                "applied_index": s.applied_index,
                "state_index": s.state_index,
                "has_quorum": s.has_quorum,
                "journal_entries": s.journal_entries,
                "replicas": [r.id for r in self._replicas(name)],
                "members": list(s.members),  # the Raft voters (addresses) this replica uses
            }
        return {"node_id": self.me.id, "raft": self.me.raft, "groups": groups}

    def forget_peer_status(self) -> None:
        """Drop the cached view of other nodes (after it proved stale)."""
        self._peer_status = {}

    async def refresh_peer_status(self) -> dict[str, dict[str, Any]]:
        """Ask every other node for its local status (unreachable nodes are left out)."""

        async def one(node: NodeConfig) -> tuple[str, dict[str, Any] | None]:
            try:
                status = await self.peer_get_json(node, "/internal/status", timeout_s=1.0)
                return node.id, status
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
                return node.id, None

        results = await asyncio.gather(*(one(n) for n in self.config.nodes if n.id != self.me.id))
        self._peer_status = {nid: s for nid, s in results if s is not None}
        return self._peer_status

    # -- peer calls -------------------------------------------------------------------------------

    async def peer_get_json(self, node: NodeConfig, path: str, timeout_s: float = 5.0) -> Any:
        assert self._session is not None
        async with self._session.get(
            node.http_url + path,
            allow_redirects=False,  # the peer key goes to peers only
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=1.0),
        ) as resp:
            return orjson.loads(await resp.read())

    async def probe_post_json(self, node: NodeConfig, path: str, body: Any, timeout_s: float) -> Any:
        """POST ``body`` to ``node``, whose address came from a request, and decode the JSON answer:
        no credential goes with it, and a redirect is not followed."""
        assert self._probe_session is not None
        async with self._probe_session.post(
            node.http_url + path,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=1.0),
        ) as resp:
            data = b""
            async for chunk in resp.content.iter_any():
                data += chunk
                if len(data) > PROBE_MAX_BYTES:
                    raise ValueError(f"the answer of {node.http} exceeds {PROBE_MAX_BYTES} bytes")
            return orjson.loads(data)

    async def peer_request(
        self, method: str, node: NodeConfig, path: str, *, body: Any = None, timeout_s: float | None = None
    ) -> tuple[int, bytes, str]:
        """Send a request to a peer; returns (status, body bytes, content type)."""
        assert self._session is not None
        data = None if body is None else orjson.dumps(body)
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=1.0) if timeout_s else None
        async with self._session.request(
            method,
            node.http_url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            allow_redirects=False,  # the peer key goes to peers only
            timeout=timeout,
        ) as resp:
            return resp.status, await resp.read(), resp.content_type

    # -- Raft proposals ---------------------------------------------------------------------------

    async def propose(self, name: str, command: bytes, timeout_s: float | None = None) -> Outcome:
        """Submit ``command`` to the local replica of group ``name`` and wait for its outcome."""
        local = self.groups[name]
        assert self._loop is not None
        loop = self._loop
        future: asyncio.Future[Outcome] = loop.create_future()

        def done(outcome: Outcome) -> None:  # tick thread
            loop.call_soon_threadsafe(set_if_pending, future, outcome)

        local.raft.submit(command, done)
        timeout_s = timeout_s or self.config.limits.request_timeout_ms / 1000
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return Outcome(error="timeout", definite=False)

    # -- long polling -----------------------------------------------------------------------------

    def _on_applied(self, applied: Applied) -> None:  # tick thread
        if self._loop is None:
            return
        # Waiters on a queue: fetch long polls (grown) and receivers (grown, or a retry scheduled).
        queues = [(q.topic_id, q.queue) for q in applied.grown] + list(applied.changed)
        if queues:
            self._loop.call_soon_threadsafe(self._wake, queues)
        if applied.scheduled:
            self._loop.call_soon_threadsafe(self._scheduled_applied)
        if applied.parked and self.on_parked is not None:
            self._loop.call_soon_threadsafe(self.on_parked, applied.parked)

    def _scheduled_applied(self) -> None:
        self._scheduled_seq += 1
        self._delivery_wake.set()

    def _wake(self, queues: list[tuple[int, int]]) -> None:
        for key in queues:
            for future in self._waiters.pop(key, ()):
                set_if_pending(future, None)

    async def wait_for_messages(self, topic_id: int, queue: int, timeout_s: float) -> None:
        """Return when the queue grows on this replica, or after ``timeout_s``."""
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        waiters = self._waiters[(topic_id, queue)]
        waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            if future in waiters:
                waiters.remove(future)

    # -- leader balancing -------------------------------------------------------------------------

    async def _balance_leaders_forever(self) -> None:
        """Hand leadership of a queue group to its preferred node (its first replica) when that
        node is up and caught up, so leaders stay spread over the cluster."""
        while True:
            await asyncio.sleep(3.0)
            try:
                await self._balance_once()
            except Exception:
                log.exception("leader_balance_failed")

    async def _balance_once(self) -> None:
        if self.change_in_progress is not None:
            return  # the change's coordinator moves leaders itself
        for g in self.config.groups_on(self.me.id):
            local = self.groups.get(str(g))
            preferred = self.config.group_replicas(g)[0]
            if local is None or preferred.id == self.me.id or not local.raft.is_leader():
                continue
            if preferred.raft_addr(1 + g) not in local.raft.members():
                continue
            status = await self.refresh_peer_status()
            peer = status.get(preferred.id, {}).get("groups", {}).get(str(g))
            mine = local.raft.status()
            if peer and peer["applied_index"] >= mine.commit_index - 10 and peer["term"] == mine.term:
                log.info("leadership_transfer", group=str(g), to=preferred.id)
                local.raft.transfer_leadership(preferred.raft_addr(1 + g))

    # -- retention --------------------------------------------------------------------------------

    async def _retention_forever(self) -> None:
        """As leader of a queue group, propose a ``retain`` tick for the queues of topics with a
        retention setting, and ``expire_producers`` when idle producer states are due. Time enters
        the state machine only through these leader-stamped ticks."""
        interval_s = self.config.raft.retention_check_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.retention_once()
            except Exception:
                log.exception("retention_tick_failed")

    async def retention_once(self) -> None:
        led = [name for name, local in self.groups.items() if name != META and local.raft.is_leader()]
        topics = await self._topics_for_retention() if led else []
        topics = [t for t in topics if t.retention_ms or t.retention_bytes]
        for name, local in self.groups.items():
            if name == META or not local.raft.is_leader():
                continue
            queues = [
                {"topic_id": t.id, "queue": q, "max_age_ms": t.retention_ms, "max_bytes": t.retention_bytes}
                for t in topics
                for q, g in enumerate(t.queue_groups)
                if str(g) == name
            ]
            if queues:
                await self._retain(name, local, queues)
            await self._expire_producers(name, local)

    async def _retain(self, name: str, local: LocalGroup, queues: list[dict[str, Any]]) -> None:
        """Propose ``retain`` again while the last one stopped at its batch bound (at most 100 per
        tick). A tick stamped further ahead of the last one than ``max_jump_ms`` is logged and
        counted (``raftmq_retention_clock_jumps_total``): the group's retention clock moved less,
        so no message is removed early (``cluster/machines/queue_group.py``, ``retention_clock``)."""
        raft = self.config.raft
        # 0: the field is left out, as releases before it wrote retain (a rolling upgrade).
        max_jump_ms: int | None = max(raft.retention_max_jump_ms, 3 * raft.retention_check_ms)
        if not raft.retention_max_jump_ms:
            max_jump_ms = None
        max_batches = raft.retention_max_batches or None
        for _ in range(100):
            if not local.raft.is_leader():
                return
            command = commands.retain(now_ms(), queues, max_jump_ms=max_jump_ms, max_batches=max_batches)
            outcome = await self.propose(name, command)
            result = outcome.result
            if outcome.error or not isinstance(result, dict) or "error" in result:
                log.warning("retention_tick_not_applied", group=name, error=outcome.error or result)
                return
            if "clock_jump_ms" in result:
                self.retention_clock_jumps[name] = self.retention_clock_jumps.get(name, 0) + 1
                log.warning(
                    "retention_clock_jump",
                    group=name,
                    jump_ms=result["clock_jump_ms"],
                    retention_clock_ms=result["retention_clock_ms"],
                    max_jump_ms=max_jump_ms,
                )
            if not result.get("more"):
                return

    async def _topics_for_retention(self) -> list[Topic]:
        """Every topic, from this node's metadata replica or, on a node without one (a queue
        group's leader need not be a metadata voter), from the first node that has one; [] when
        none answers (the next tick tries again)."""
        if self.metadata is not None:
            return self.metadata.topics()
        leader = self.leader_of(META)
        others = [n for n in self.config.nodes if n.id != self.me.id and n != leader]
        for node in ([leader] if leader is not None else []) + others:
            try:
                body = await self.peer_get_json(node, "/internal/topics", timeout_s=2.0)
                return [Topic.from_json(t) for t in body["topics"]]
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError):
                continue
        return []

    async def _expire_producers(self, name: str, local: LocalGroup) -> None:
        """Propose ``expire_producers`` steps while this leader's store shows idle producer states
        are due (``limits.producer_idle_ms``, 0: never); at most 100 steps, the next tick goes on."""
        idle_ms = self.config.limits.producer_idle_ms
        expired = 0
        for _ in range(100 if idle_ms else 0):
            if not local.raft.is_leader() or not producers.expiry_due(local.machine.store, now_ms(), idle_ms):
                break
            outcome = await self.propose(name, expire_producers(now_ms(), idle_ms))
            result = outcome.result
            if outcome.error or not isinstance(result, dict) or "error" in result:
                log.warning("expire_producers_not_applied", group=name, error=outcome.error or result)
                break
            expired += result["expired"]
        if expired:
            log.info("producers_expired", group=name, count=expired)

    # -- delivery ticks ---------------------------------------------------------------------------

    async def _deliver_forever(self) -> None:
        """As leader of a queue group, propose ``deliver_tick`` when a delayed message is due or an
        in-flight deadline passed: at that time (woken early when an apply schedules something
        sooner), and at least every ``delivery.tick_ms``. Time enters the state machine only through
        this leader-stamped tick; a new leader's loop continues where the old one stopped, since the
        schedule is in the replicated state."""
        tick_s = self.config.delivery.tick_ms / 1000
        while True:
            self._delivery_wake.clear()
            try:
                wait_s = await self.deliver_once()
            except Exception:
                log.exception("deliver_tick_failed")
                wait_s = tick_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._delivery_wake.wait(), min(max(wait_s, 0.001), tick_s))

    async def deliver_once(self) -> float:
        """Propose the ticks that are due; returns the seconds until the next known due time."""
        settings = self.config.delivery
        next_due: int | None = None
        for name, local in self.groups.items():
            if name == META or not local.raft.is_leader():
                self._due_cache.pop(name, None)  # a leader looks at the schedule once first
                continue
            for _ in range(100):  # bounded: the loop comes back at once if more is due
                now = now_ms()
                known, due = self._known_due(name, local, now)
                if not known:
                    index, seq = local.machine.applied_index, self._scheduled_seq
                    due = next_due_ms(local.machine.store)
                    self._due_cache[name] = (index, seq, now, due)
                if due is None or due > now:
                    break
                outcome = await self.propose(name, commands.deliver_tick(now, settings.tick_max_items))
                if outcome.error or not isinstance(outcome.result, dict) or "error" in outcome.result:
                    log.warning("deliver_tick_not_applied", group=name, error=outcome.error or outcome.result)
                    due = None
                    break
            if due is not None:
                next_due = due if next_due is None else min(next_due, due)
        if next_due is None:
            return settings.tick_ms / 1000
        return max(0.0, (next_due - now_ms()) / 1000)

    def _known_due(self, name: str, local: LocalGroup, now: int) -> tuple[bool, int | None]:
        """``(True, due)`` when group ``name``'s next due time is known without a look at the store
        (its deadline index scan passes over every settled entry's tombstone): nothing was applied
        since the last look, or nothing that woke the loop (an entry added without waking it is due
        ``WAKE_WITHIN_MS`` after its command at the earliest, so one look in that time, a tick
        early, finds it on time). A cached time may be early (settled since): the look then finds
        the real one."""
        cached = self._due_cache.get(name)
        if cached is None:
            return False, None
        index, seq, looked_ms, due = cached
        if due is not None and due <= now:
            return False, None
        if local.machine.applied_index == index:
            return True, due
        horizon = looked_ms + WAKE_WITHIN_MS - self.config.delivery.tick_ms
        if seq != self._scheduled_seq or now >= horizon:
            return False, None
        return True, due if due is not None and due < horizon else horizon

    # -- checkpoints (snapshot install) ------------------------------------------------------------

    def make_checkpoint_tar(self, name: str, min_index: int = 0) -> str:
        """Checkpoint group ``name``'s state into a tar file; returns its path (caller deletes).

        The tar holds ``checkpoint/`` (the RocksDB checkpoint) and ``meta.json`` (group, node, the
        applied index before the checkpoint was taken: the checkpoint holds at least that).

        Raises:
            CheckpointBehind: this replica has applied less than ``min_index`` (a follower that
                lags the snapshot the fetching replica must cover).
        """
        local = self.groups[name]
        applied = local.machine.applied_index
        if applied < min_index:
            raise CheckpointBehind(f"node {self.me.id} applied group {name} to {applied}, not {min_index}")
        stamp = f"{name}-{time.time_ns()}"
        ckpt_dir = os.path.join(self.node_dir, "tmp", f"ckpt-{stamp}")
        tar_path = ckpt_dir + ".tar"
        local.machine.store.checkpoint(ckpt_dir)
        try:
            with open(ckpt_dir + ".json", "wb") as f:
                f.write(orjson.dumps({"group": name, "node_id": self.me.id, "applied_index": applied}))
            with tarfile.open(tar_path, "w") as tar:
                tar.add(ckpt_dir, arcname="checkpoint")
                tar.add(ckpt_dir + ".json", arcname="meta.json")
        finally:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(ckpt_dir + ".json")
        return tar_path

    def _fetch_checkpoint(self, name: str, manifest: dict[str, Any]) -> tuple[str, int]:
        """Download and check a checkpoint of group ``name`` covering the snapshot ``manifest``
        (RaftGroup's checkpoint thread; blocking). Returns the checkpoint directory (the caller
        restores or deletes it) and the applied index read from it.

        Sources, in order: the group's leader as this replica knows it, the replica that wrote the
        manifest, then the other replicas; each is asked for a state at or past the manifest's
        ``state_index`` (a lagging replica refuses) and what arrives is checked: its ``meta.json``
        names this group, it opens as a store, and its applied index is at least that.
        """
        need = int(manifest["state_index"])
        local = self.groups.get(name)
        members = [self.node_for_addr(a) for a in (local.raft.members() if local else ())]
        replicas = {n.id: n for n in [*self._replicas(name), *(m for m in members if m is not None)]}
        leader_addr = local.raft.leader() if local else None
        leader = self.node_for_addr(leader_addr) if leader_addr else None
        first = [leader.id if leader else None, manifest.get("node_id")]
        order = sorted(
            (r for r in replicas.values() if r.id != self.me.id),
            key=lambda r: (first.index(r.id) if r.id in first else len(first), r.id),
        )
        # No proxy from the environment: a checkpoint goes straight to a peer, with the peer key.
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            NO_REDIRECTS,
            urllib.request.HTTPSHandler(context=self.ssl_context),
        )
        errors = []
        for node in order:
            dest = os.path.join(self.node_dir, "tmp", f"incoming-{name}-{time.time_ns()}")
            tar_path = dest + ".tar"
            try:
                self._checkpoint_fetch_fault(name)
                request = urllib.request.Request(
                    f"{node.http_url}/internal/groups/{name}/checkpoint?min_index={need}",
                    headers={PEER_HEADER: self.keys.peer},
                )
                with opener.open(request, timeout=_CHECKPOINT_TIMEOUT_S) as resp, open(tar_path, "wb") as f:
                    shutil.copyfileobj(resp, f, 1 << 20)
                with tarfile.open(tar_path) as tar:
                    _safe_extract(tar, dest)
                index = _check_checkpoint(name, dest, need)
                # Written to disk here, so the restore on the group's tick thread finds nothing dirty.
                _fsync_files(os.path.join(dest, "checkpoint"))
                os.rename(os.path.join(dest, "checkpoint"), dest + ".checkpoint")
                shutil.rmtree(dest, ignore_errors=True)
                return dest + ".checkpoint", index
            except Exception as e:  # try the next replica
                errors.append(f"{node.id}: {e}")
                shutil.rmtree(dest, ignore_errors=True)
            finally:
                if os.path.exists(tar_path):
                    os.remove(tar_path)
        raise RuntimeError(f"no replica could send a checkpoint of group {name} at index {need}: {errors}")

    def _checkpoint_fetch_fault(self, name: str) -> None:
        """Test fault ``[faults] checkpoint_fetch_fault_file``: while that file says ``fail`` every
        checkpoint fetch fails; while it says ``stall`` a fetch waits (up to 60 s), then fails."""
        path = self.config.faults.checkpoint_fetch_fault_file
        if not path:
            return
        deadline = time.monotonic() + 60
        while True:
            try:
                with open(path) as f:
                    mode = f.read().strip()
            except FileNotFoundError:
                return
            if mode not in ("fail", "stall"):
                return
            if mode == "fail" or time.monotonic() > deadline:
                log.warning("test_fault_checkpoint_fetch", group=name, mode=mode)
                raise RuntimeError(f"test fault: checkpoint fetch {mode}")
            time.sleep(0.2)

    def store_digest(self, name: str) -> dict[str, Any]:
        """A hash of every key and value of group ``name``'s state (replicas compare equal)."""
        store: Store = self.groups[name].machine.store
        h = hashlib.sha256()
        keys = 0
        for k, v in store.scan(b""):
            h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
            keys += 1
        return {
            "group": name,
            "state_index": self.groups[name].machine.applied_index,
            "keys": keys,
            "sha256": h.hexdigest(),
        }


class CheckpointBehind(Exception):
    """This replica's state is behind the index a checkpoint was asked for."""


_CHECKPOINT_TIMEOUT_S = 30.0  # per socket operation of a checkpoint download


def _fsync_files(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _check_checkpoint(name: str, dest: str, need: int) -> int:
    """The applied index of the checkpoint extracted into ``dest``, once it is known to be group
    ``name``'s state at or past ``need``; raises ``ValueError`` otherwise."""
    with open(os.path.join(dest, "meta.json"), "rb") as f:
        meta = orjson.loads(f.read())
    if meta.get("group") != name:
        raise ValueError(f"checkpoint of group {meta.get('group')!r}, not {name!r}")
    store = RocksStore.open(os.path.join(dest, "checkpoint"))  # raises StoreError if it does not open
    try:
        index = metadata_applied_index(store) if name == META else queues_applied_index(store)
    finally:
        store.close()
    if index < need or index < int(meta.get("applied_index", 0)):
        raise ValueError(f"checkpoint at index {index}; the snapshot needs {need}, its source said {meta}")
    return index


def _safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    """Extract a checkpoint tar under ``dest``: regular files and directories only, never a link
    or a path outside ``dest``, and nothing at all if any member breaks that (``cluster/base/safe_tar.py``).

    Raises:
        UnsafeArchive: a ValueError naming the member.
    """
    from raftmq.cluster.base.safe_tar import safe_extract

    safe_extract(tar, dest)


def set_if_pending(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
