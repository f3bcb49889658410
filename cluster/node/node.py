"""One raftmq node: the Raft groups placed on it, their stores, and its view of the cluster.

Layout on disk (``<data_dir>/<node_id>/``)::

    groups/meta/{state,raft,snapshot/}   the metadata group's replica (if this node is a voter)
    groups/<g>/{state,raft,snapshot/}    queue group g's replica (if placed here)
    placement.json                       the last placement this node saw (cluster/node/reconcile.py)
    peers.json                           what each peer advertised last (cluster/node/peer_releases.py)
    tmp/                                 checkpoint transfers (cluster/node/checkpoints.py)

Placement: ``config`` is the cluster file overlaid with the metadata group's placement (nodes and
replicas per group); it is replaced, never mutated, when the placement changes. ``file_config`` is
the cluster file as loaded. The groups hosted here follow the placement (``cluster/node/reconcile.py``);
``groups`` is likewise replaced, never mutated, so loops iterating it across awaits stay valid.

Raft ports: the metadata group listens on the node's ``raft`` port, queue group ``g`` on port+1+g.

Threads: the asyncio loop (HTTP) and one tick thread per Raft group. Tick threads reach the loop
only through ``loop_calls`` (``cluster/base/loop_calls.py``: one wake-up for the calls waiting).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import shutil
import time
from typing import Any

import aiohttp
import orjson
import structlog

from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import error_body
from raftmq.cluster.base.groups import META, group_sort_key, port_offset
from raftmq.cluster.base.loop_calls import LoopCalls
from raftmq.cluster.config.cluster_file import ClusterConfig, NodeConfig
from raftmq.cluster.config.keys import PEER_HEADER, derive_keys
from raftmq.cluster.config.tls import client_context
from raftmq.cluster.machines.metadata import MetadataMachine
from raftmq.cluster.machines.placement import Placement, overlay
from raftmq.cluster.machines.queue_group import Applied, QueueGroupMachine
from raftmq.cluster.node.checkpoints import Checkpoints
from raftmq.cluster.node.compactor import Compactor
from raftmq.cluster.node.parked import ParkedReports
from raftmq.cluster.node.peer_releases import PeerReleases
from raftmq.cluster.node.raft_settings import group_raft_settings
from raftmq.cluster.node.reconcile import Reconciler
from raftmq.cluster.node.sealer import Sealer
from raftmq.cluster.node.ticks import TickLoops
from raftmq.cluster.node.view import LocalGroup
from raftmq.cluster.node.waiters import QueueWaiters, set_if_pending
from raftmq.cluster.replication.admission import AdmissionLimits, RaftAdmission
from raftmq.cluster.replication.group_commit import GroupCommitter
from raftmq.cluster.replication.raft import Outcome, RaftGroup, StateMachine
from raftmq.cluster.replication.upgrade import (
    BATCH_FORMATS,
    BEFORE_CAPABILITIES,
    CAPABILITIES,
    advertised,
    capability_of,
    gated_fields_of,
    previous_release_refuses,
)
from raftmq.storage.rocks import RocksStore

__all__ = ["PEER_STATUS_MAX_AGE_S", "LocalGroup", "Node", "set_if_pending"]

PEER_STATUS_MAX_AGE_S = 10.0
"""How long a fetched peer status may say who leads a group (:meth:`Node.leader_of`); statuses are
fetched again when a forward finds no leader (``router.py``) and by the leader balancer every 3 s."""

log = structlog.get_logger(__name__)

PROBE_MAX_BYTES = 64 * 1024  # an answer read from an address that came from a request
FILE_PASS_CONNECTIONS = 32  # files passed on from peers at once: their own pool, never the calls'


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
        lim = config.limits
        # Every Raft port of this node shares one bound on connections that have not authenticated.
        self.raft_admission = RaftAdmission(
            AdmissionLimits(
                auth_timeout_s=lim.raft_auth_timeout_ms / 1000,
                max_unauthenticated=lim.raft_max_unauthenticated,
                max_per_source=lim.raft_max_unauthenticated_per_source,
            )
        )
        self.node_dir = self.me.node_dir()
        self.groups: dict[str, LocalGroup] = {}
        self.metadata: MetadataMachine | None = None
        self._addr_to_node: dict[str, NodeConfig] = {}
        self._set_config(config)
        self.waiters = QueueWaiters()  # fetch long polls and receive waits on the loop (waiters.py)
        # Dead letters parked for want of a dead-letter topic, as applies report them (parked.py);
        # SubscriptionsApi takes the reports and creates the topic where this node leads.
        self.parked = ParkedReports()
        self.ticks = TickLoops(self)  # leader balancing, retention, delivery ticks (ticks.py)
        self.checkpoints = Checkpoints(self)  # snapshot install transfers (checkpoints.py)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.loop_calls: LoopCalls | None = None  # how tick threads reach the loop (one wake-up for many)
        self._session: aiohttp.ClientSession | None = None  # carries the peer key: known nodes only
        self._probe_session: aiohttp.ClientSession | None = None  # no credential: addresses from requests
        self._file_session: aiohttp.ClientSession | None = None  # files passed on (LeaderRouter.open_at)
        self._peer_status: dict[str, dict[str, Any]] = {}
        self._peer_status_at: dict[str, float] = {}  # when each was fetched (time.monotonic)
        self._binary_voters: set[tuple[str, frozenset[str]]] = set()  # (group, voters) reading format 2
        # group -> (the config, the Raft members, the voters they give): _voters' last answer
        self._voters_of: dict[str, tuple[ClusterConfig, tuple[str, ...], frozenset[str]]] = {}
        self.peer_releases = PeerReleases(os.path.join(self.node_dir, "peers.json"))  # kept on disk
        self._v2_nodes, self._capable = self.peer_releases.v2_nodes, self.peer_releases.capable
        self._capable_voters: set[tuple[str, str, frozenset[str]]] = set()  # (group, capability, voters)
        self._status_refresh: asyncio.Task[Any] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.sealer: Sealer | None = None  # segment sealing (cluster/machines/segments.py), set by start
        self.compactor = Compactor()  # frees the disk of removed messages (compactor.py)
        self.ssl_context = client_context(config)  # peer calls over HTTPS (None: plain HTTP)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def peer_session(self) -> aiohttp.ClientSession | None:
        """The session of calls to known nodes (it carries the peer key); None before ``start``."""
        return self._session

    @property
    def file_session(self) -> aiohttp.ClientSession | None:
        """Peer calls passing files on (segments), held while a client reads: a pool of their own."""
        return self._file_session

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.loop_calls = LoopCalls(self._loop)
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
        self._file_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl_context or True, limit=FILE_PASS_CONNECTIONS),
            headers={PEER_HEADER: self.keys.peer},
            trust_env=False,
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
        self._tasks.append(asyncio.create_task(self.ticks.balance_leaders_forever()))
        self._tasks.append(asyncio.create_task(self.ticks.retention_forever()))
        self._tasks.append(asyncio.create_task(self.ticks.deliver_forever()))
        self._tasks.append(asyncio.create_task(self.ticks.learn_peer_releases()))
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
            machine = QueueGroupMachine(
                store, int(name), cache_entries=self.config.limits.apply_cache_entries
            )
            machine.on_applied = functools.partial(self._on_applied, name, store)
            if store.blob_gc_under_way:  # cut short by a restart: goes on now, not at the next removal
                self.compactor.freed(name, store, ((b"", b""),))
            if self.config.faults.previous_release_node == self.me.id:  # TEST FAULT: as that release
                machine.refuses = previous_release_refuses
        # The seed voters count only while the group's log holds no configuration (a new group).
        seed = [n.raft_addr(port_offset(name)) for n in self.replicas(name)]
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
                binary_ok=lambda: self.reads_binary(name),
                take_ok=lambda: self.group_supports(name, "append.take"),
                call_soon=self.loop_calls.call if self.loop_calls else None,
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
        await loop.run_in_executor(None, local.close_stores)  # waits for their users: off the loop
        if delete:
            await loop.run_in_executor(None, shutil.rmtree, os.path.join(self.node_dir, "groups", name))
        log.info("group_stopped", group=name, node_id=self.me.id, deleted=delete)

    def hint_peers(self) -> None:
        """Point every local replica at its group's replicas as the placement says (see
        :meth:`RaftGroup.hint_peers`): a replica that missed a voter change still hears the leader."""
        for name, local in self.groups.items():
            local.raft.hint_peers(n.raft_addr(port_offset(name)) for n in self.replicas(name))

    def replicas(self, name: str) -> tuple[NodeConfig, ...]:
        replicas = self.config.metadata_voters if name == META else self.config.group_replicas(int(name))
        return replicas if any(r.id == self.me.id for r in replicas) else (*replicas, self.me)

    def _start_group(
        self, name: str, seed: list[str], machine: StateMachine, store: RocksStore, joining: bool
    ) -> LocalGroup:
        journal_store = RocksStore.open(self._group_dir(name, "raft"))
        settings = group_raft_settings(self.config, self.keys.raft, name, self.me.id)
        raft = RaftGroup(
            name=name,
            node_id=self.me.id,
            self_addr=self.me.raft_addr(port_offset(name)),
            peer_addrs=seed,
            journal_store=journal_store,
            machine=machine,
            snapshot_file=os.path.join(self._group_dir(name, "snapshot"), "manifest.json"),
            settings=settings,
            fetch_checkpoint=lambda manifest: self.checkpoints.fetch(name, manifest),
            bind_addr=self.me.raft_bind_addr(port_offset(name)),  # pysyncobj's default is 0.0.0.0
            joining=joining,
            campaign_first=self.replicas(name)[0].id == self.me.id,  # the placement's first replica
            admission=self.raft_admission,
        )
        return LocalGroup(name, raft, machine, store, journal_store)

    async def stop(self) -> None:
        for task in [*self._tasks, *self.compactor.tasks()]:
            task.cancel()
        loop = asyncio.get_running_loop()
        for local in list(self.groups.values()):
            await loop.run_in_executor(None, local.raft.destroy)
            await loop.run_in_executor(None, local.close_stores)
        for session in (self._session, self._probe_session, self._file_session):
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
        the others go on), the peer claiming the leadership with the highest term in the peer
        statuses fetched (:meth:`refresh_peer_status`) at most :data:`PEER_STATUS_MAX_AGE_S` ago:
        an older claim says nothing about now (the leader may have moved or died since), and
        unknown lets the caller ask again instead of forwarding to a node that no longer leads."""
        local = self.groups.get(name)
        if local is not None:
            leader = self.node_for_addr(local.raft.leader())
            if leader is not None:
                return leader
        oldest = time.monotonic() - PEER_STATUS_MAX_AGE_S
        claims = [
            (int(g.get("term", 0)), str(status["node_id"]))
            for node_id, status in self._peer_status.items()
            if self._peer_status_at.get(node_id, -math.inf) >= oldest
            and (g := status.get("groups", {}).get(name))
            and g.get("is_leader")
        ]
        return self.node_by_id(max(claims)[1]) if claims else None

    def local_status(self) -> dict[str, Any]:
        groups = {}
        for name, local in self.groups.items():
            s = local.raft.status()
            # A leader this replica no longer hears (its election timer ran out: pre-vote keeps
            # pysyncobj from forgetting it, as its campaign did) is not reported.
            leader = self.node_for_addr(s.leader) if s.is_leader or s.hears_leader else None
            groups[name] = {
                "leader": leader.id if leader else None,
                "is_leader": s.is_leader,
                "term": s.term,
                "commit_index": s.commit_index,
                "applied_index": s.applied_index,
                "state_index": s.state_index,
                "has_quorum": s.has_quorum,
                "journal_entries": s.journal_entries,
                "replicas": [r.id for r in self.replicas(name)],
                "members": list(s.members),  # the Raft voters (addresses) this replica uses
                # Who raised this replica's term and why (cluster/replication/term_record.py).
                "term_rises": [
                    {"cause": r.cause, "peer": r.peer, "count": r.count, "deposed": r.deposed}
                    for r in s.term_rises
                ],
            }
        status: dict[str, Any] = {
            "node_id": self.me.id,
            "raft": self.me.raft,
            "groups": groups,
            "batch_formats": self.batch_formats,
        }
        if self.config.faults.previous_release_node != self.me.id:  # TEST FAULT: that release had none
            status["capabilities"] = sorted(self.capabilities)
        return status

    @property
    def batch_formats(self) -> list[int]:
        """The record-batch formats this node reads (docs/format.md, rolling upgrades)."""
        return [1] if self.config.faults.v1_only_node == self.me.id else list(BATCH_FORMATS)

    @property
    def capabilities(self) -> frozenset[str]:
        """The ops and field levels this node applies (``cluster/replication/upgrade.py``)."""
        previous = self.config.faults.previous_release_node == self.me.id
        return BEFORE_CAPABILITIES if previous else CAPABILITIES

    def _voters(self, name: str) -> frozenset[str]:
        """The voters of group ``name``: the configured replicas and the Raft members this replica
        knows (during a change both count). Asked per proposal (reads_binary), so the answer is
        kept for as long as the configuration (replaced, never mutated) and the members are the
        same. Loop only."""
        local = self.groups.get(name)
        members = local.raft.members() if local is not None else ()
        kept = self._voters_of.get(name)
        if kept is not None and kept[0] is self.config and kept[1] == members:
            return kept[2]
        voters = {r.id for r in self.replicas(name)}
        voters |= {n.id for a in members if (n := self.node_for_addr(a)) is not None}
        kept = self._voters_of[name] = (self.config, members, frozenset(voters))
        return kept[2]

    def reads_binary(self, name: str) -> bool:
        """Whether every voter of group ``name`` reads binary ``append`` commands (format 2): the
        Raft members this replica knows and the configured replicas, each one having advertised
        format 2 in a status answer (a node that did is remembered, so a peer that is down for a
        while does not send the group back to JSON). Checked per proposal; the answer for one set
        of voters is kept, and a new voter is checked again. While False, the peers' statuses are
        asked again, at most once a second."""
        voters = self._voters(name)
        key = (name, voters)
        if key in self._binary_voters:
            return True
        if 2 in self.batch_formats and voters - {self.me.id} <= self._v2_nodes:
            self._binary_voters.add(key)
            return True
        self._refresh_peer_status_soon()
        return False

    def group_supports(self, name: str, capability: str) -> bool:
        """Whether every voter of group ``name`` applies ``capability`` (an op or field level of
        ``cluster/replication/upgrade.py``), so this leader may write it. As :meth:`reads_binary`:
        each voter must have advertised it in a status answer (what a peer advertised last is
        kept, so a peer down for a while keeps it); the answer for one set of voters is kept, a
        new voter is checked again, and while False the peers are asked again at most once a
        second. What every release applies needs no check."""
        if capability in BEFORE_CAPABILITIES:
            return True
        voters = self._voters(name)
        key = (name, capability, frozenset(voters))
        if key in self._capable_voters:
            return True
        if capability in self.capabilities and all(
            capability in self._capable.get(v, ()) for v in voters - {self.me.id}
        ):
            self._capable_voters.add(key)
            return True
        self._refresh_peer_status_soon()
        return False

    async def await_group_supports(self, name: str, capability: str) -> bool:
        """As :meth:`group_supports`, but a voter whose status this node has never had is asked
        first: on a new cluster, the first requests after start are not a rolling upgrade."""
        if self.group_supports(name, capability):
            return True
        if self._voters(name) - {self.me.id} - set(self._capable):
            await self.refresh_peer_status()
            return self.group_supports(name, capability)
        return False

    def _refresh_peer_status_soon(self) -> None:
        """Ask the peers for their status in the background, at most once a second."""
        if self._loop is not None and (self._status_refresh is None or self._status_refresh.done()):

            async def refresh() -> None:
                await self.refresh_peer_status()
                await asyncio.sleep(1.0)

            self._status_refresh = self._loop.create_task(refresh())

    def forget_peer_status(self) -> None:
        """Drop the cached view of other nodes (after it proved stale)."""
        self._peer_status = {}
        self._peer_status_at = {}

    async def refresh_peer_status(self) -> dict[str, dict[str, Any]]:
        """Ask every other node for its local status (unreachable nodes are left out)."""

        async def one(node: NodeConfig) -> tuple[str, dict[str, Any] | None]:
            try:
                status = await self.peer_get_json(node, "/internal/status", timeout_s=1.0)
                return node.id, status
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
                return node.id, None

        results = await asyncio.gather(*(one(n) for n in self.config.nodes if n.id != self.me.id))
        fetched_at = time.monotonic()
        self._peer_status = {nid: s for nid, s in results if s is not None}
        self._peer_status_at = dict.fromkeys(self._peer_status, fetched_at)
        for node_id, status in self._peer_status.items():  # kept while the peer is down (upgrade.py)
            if self.peer_releases.record(node_id, advertised(status), 2 in status.get("batch_formats", ())):
                self._capable_voters.clear()  # a rolled-back peer no longer passes a gate it passed
        return self._peer_status

    def heard_from(self) -> set[str]:
        """The peers that answered a status call since this node started (peer_releases.py)."""
        return set(self.peer_releases.heard)

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
        self,
        method: str,
        node: NodeConfig,
        path: str,
        *,
        body: Any = None,
        raw: bytes | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes, str]:
        """Send a request to a peer (a JSON ``body``, or ``raw`` bytes); returns (status, body
        bytes, content type)."""
        assert self._session is not None
        data = raw if body is None else orjson.dumps(body)
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
        """Submit ``command`` to the local replica of group ``name`` and wait for its outcome.

        A backstop of the rolling-upgrade gate: an op that a voter of the group has not advertised
        is not proposed (``upgrade_in_progress``, nothing done), so an op added to the op tables
        is never written to a voter that would refuse it, even where its leader code does not ask
        :meth:`group_supports` first. Field levels are gated where the command is built."""
        capability = capability_of(name, command, META) or ""
        # An op missing from the op tables is not gated here (add it there: cluster/commands OPS,
        # cluster/machines/metadata.py OPS).
        if capability in CAPABILITIES and not await self.await_group_supports(name, capability):
            message = f"a voter of group {name} does not apply {capability} yet (a rolling upgrade)"
            return Outcome(result=error_body(errors.UPGRADE_IN_PROGRESS, message))
        for level in gated_fields_of(capability, command):  # a topic's attributes, tags at creation
            if not await self.await_group_supports(name, level):
                message = f"a metadata voter does not apply {level} yet (a rolling upgrade)"
                return Outcome(result=error_body(errors.UPGRADE_IN_PROGRESS, message))
        local = self.groups[name]
        calls = self.loop_calls
        assert self._loop is not None and calls is not None
        future: asyncio.Future[Outcome] = self._loop.create_future()
        local.raft.submit(command, lambda outcome: calls.call(set_if_pending, future, outcome))
        timeout_s = timeout_s or self.config.limits.request_timeout_ms / 1000
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return Outcome(error="timeout", definite=False)

    # -- long polling -----------------------------------------------------------------------------

    def _on_applied(self, name: str, store: RocksStore, applied: Applied) -> None:  # tick thread
        self.ticks.applied(name, applied)  # its clock jump counted, what it scheduled recorded
        if self.loop_calls is None or not applied.news():
            return
        if applied.only_grown() and not self.waiters.watching:
            local = self.groups.get(name)
            if local is not None and not local.raft.is_leader():
                # A follower's growth with nobody watching (waiters.py): nothing on the loop would
                # use it (the sealer looks at a group only once it leads it) and no watcher can
                # miss it, so the loop is not woken: on a follower, a wake-up per entry.
                return
        self.loop_calls.call(self._applied, name, store, applied)

    def _applied(self, name: str, store: RocksStore, applied: Applied) -> None:  # the loop (LoopCalls)
        # Waiters on a queue: fetch long polls (grown) and receivers (grown, or a retry scheduled).
        self.waiters.wake([(q.topic_id, q.queue) for q in applied.grown] + list(applied.changed))
        if applied.grown and self.sealer is not None:
            self.sealer.grown(name, [(q.topic_id, q.queue) for q in applied.grown])
        if applied.scheduled:
            self.ticks.scheduled()
        if applied.parked:
            self.parked.put(applied.parked)
        self.compactor.freed(name, store, applied.freed)  # nothing when none
