"""Prometheus metrics of a node (``GET /metrics``).

Request counts and latencies are counted by a middleware. Raft and storage figures are read from the
node when Prometheus scrapes (a custom collector), so the produce path and the tick threads pay
nothing for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from raftmq.cluster.base.groups import META
from raftmq.cluster.base.timing import LatencyHistogram
from raftmq.cluster.machines.views import consumer_queues, queue_metas
from raftmq.cluster.node.barriers import BarrierCounts
from raftmq.cluster.node.node import Node
from raftmq.cluster.node.read_ahead import ReadAheadCounts
from raftmq.storage.store import StoreError
from raftmq.storage.work import background_work

__all__ = [
    "METRICS_KEY",
    "BarrierCollector",
    "Metrics",
    "ReadAheadCollector",
    "WaitingReceiversCollector",
    "metrics_handler",
    "metrics_middleware",
]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15)


_Family = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _add_histogram(family: HistogramMetricFamily, key: list[str], hist: LatencyHistogram) -> None:
    buckets, total_s = hist.snapshot()
    family.add_metric(key, buckets, total_s)


class _RaftCollector(Collector):
    """Per-replica Raft state, latencies and journal figures of every group on this node."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> Iterator[_Family]:
        labels = ["node_id", "group_id"]
        gauges = {
            "term": GaugeMetricFamily("raftmq_raft_term", "Current Raft term of the replica", labels=labels),
            "leader": GaugeMetricFamily(
                "raftmq_raft_is_leader", "1 if this replica leads its group", labels=labels
            ),
            "quorum": GaugeMetricFamily(
                "raftmq_raft_has_quorum", "1 if this replica sees a majority of its group", labels=labels
            ),
            "commit": GaugeMetricFamily("raftmq_raft_commit_index", "Raft commit index", labels=labels),
            "applied": GaugeMetricFamily(
                "raftmq_raft_applied_index", "Raft index applied here", labels=labels
            ),
            "lag": GaugeMetricFamily(
                "raftmq_raft_apply_lag_entries",
                "Committed entries not yet applied on this replica",
                labels=labels,
            ),
            "journal": GaugeMetricFamily(
                "raftmq_journal_entries", "Entries retained in the journal", labels=labels
            ),
            "journal_bytes": GaugeMetricFamily(
                "raftmq_journal_bytes", "Bytes of retained commands", labels=labels
            ),
        }
        became_leader = CounterMetricFamily(
            "raftmq_raft_became_leader",
            "Times this replica became leader (summed over a group's replicas: its leader changes)",
            labels=labels,
        )
        pre_votes = CounterMetricFamily(
            "raftmq_raft_pre_votes",
            "Pre-vote rounds this replica started: its election timer ran out (refused while the "
            "other voters hear a leader: a follower behind it, not an election)",
            labels=labels,
        )
        leaders_lost = CounterMetricFamily(
            "raftmq_raft_leader_connections_lost",
            "Times this follower's connection to its leader closed and it asked for an election at "
            "once instead of waiting out its election timeout (a killed leader's sockets close)",
            labels=labels,
        )
        unanswered = CounterMetricFamily(
            "raftmq_raft_pre_vote_unanswered_campaigns",
            "Elections this replica started without a majority's pre-vote grants because a majority "
            "left its round unanswered (voters from before pre-vote, or too slow to answer)",
            labels=labels,
        )
        backlog_holds = CounterMetricFamily(
            "raftmq_raft_follower_backlog_holds",
            "Rounds in which this leader sent a follower nothing more: the bytes queued for it had "
            "reached raft.max_follower_backlog_bytes (a follower reading more slowly than it writes)",
            labels=labels,
        )
        deferrals = CounterMetricFamily(
            "raftmq_raft_compaction_deferrals",
            "Times this leader held a due journal compaction back because a connected follower had "
            "not been sent the entries up to the cut (it would need a snapshot), until it was sent "
            "them or the journal passed twice raft.compaction_max_bytes",
            labels=labels,
        )
        clock_jumps = CounterMetricFamily(
            "raftmq_retention_clock_jumps",
            "Retention ticks proposed here whose time ran too far ahead (age-based removal held back)",
            labels=labels,
        )
        group_clock_jumps = CounterMetricFamily(
            "raftmq_group_clock_jumps",
            "Entries applied here whose leader stamp the queue group's time clamped (ahead of the "
            "group's previous stamp by more than the bound)",
            labels=labels,
        )
        seal_checks = CounterMetricFamily(
            "raftmq_segment_queue_checks",
            "Queues this node's sealer looked at for a range to seal, as the group's leader (those "
            "that received messages or age towards segments.max_age_ms, and every queue once per "
            "leadership: an idle queue is not looked at)",
            labels=labels,
        )
        snapshot_installs = CounterMetricFamily(
            "raftmq_raft_snapshot_installs",
            "Snapshots installed on this replica from a checkpoint fetched from a peer",
            labels=labels,
        )
        snapshot_failures = CounterMetricFamily(
            "raftmq_raft_snapshot_install_failures",
            "Checkpoint fetches or checks for a snapshot install that failed (the install waits)",
            labels=labels,
        )
        commit_s = _histogram(
            "raftmq_raft_commit_seconds",
            "Entries proposed at this node: time until committed on a majority and applied here",
            labels,
        )
        apply_s = _histogram(
            "raftmq_raft_apply_seconds", "Time the state machine took to apply one entry", labels
        )
        fsync_s = _histogram("raftmq_journal_fsync_seconds", "Journal fsyncs and their duration", labels)
        node_id = self._node.me.id
        for name, local in list(self._node.groups.items()):
            s = local.raft.status()
            key = [node_id, name]
            for family, value in (
                ("term", s.term),
                ("leader", int(s.is_leader)),
                ("quorum", int(s.has_quorum)),
                ("commit", s.commit_index),
                ("applied", s.applied_index),
                ("lag", max(0, s.commit_index - s.applied_index)),
                ("journal", s.journal_entries),
                ("journal_bytes", local.raft.journal_stats()["bytes"]),
            ):
                gauges[family].add_metric(key, value)
            became_leader.add_metric(key, local.raft.became_leader_count)
            pre_votes.add_metric(key, local.raft.pre_vote.rounds)
            unanswered.add_metric(key, local.raft.pre_vote.campaigns_unanswered)
            leaders_lost.add_metric(key, local.raft.pre_vote.leaders_lost)
            backlog_holds.add_metric(key, local.raft.backlog.holds)
            deferrals.add_metric(key, local.raft.compaction_deferrals.deferrals)
            snapshot_installs.add_metric(key, local.raft.snapshot_gate.installs)
            snapshot_failures.add_metric(key, local.raft.snapshot_gate.install_failures)
            if name != "meta":
                clock_jumps.add_metric(key, self._node.ticks.retention_clock_jumps.get(name, 0))
                group_clock_jumps.add_metric(key, self._node.ticks.group_clock_jumps.get(name, 0))
                sealer = self._node.sealer
                seal_checks.add_metric(key, sealer.queue_checks.get(name, 0) if sealer is not None else 0)
            _add_histogram(commit_s, key, local.raft.commit_latency)
            _add_histogram(apply_s, key, local.raft.apply_latency)
            _add_histogram(fsync_s, key, local.raft.fsync_latency)
        yield from gauges.values()
        yield from (became_leader, pre_votes, unanswered, leaders_lost, backlog_holds, deferrals)
        yield from (clock_jumps, group_clock_jumps, seal_checks, snapshot_installs, snapshot_failures)
        yield from self._term_rises(node_id)
        yield from self._raft_connections(node_id)
        yield from self._shared_bodies(node_id)
        yield from (commit_s, apply_s, fsync_s)
        wakeups = CounterMetricFamily(
            "raftmq_loop_wakeups",
            "Times the tick threads woke this node's event loop (one self-pipe write for the calls "
            "waiting: an entry's outcome, the waiters of queues that grew); a follower's apply that "
            "only grew queues nobody here waits for wakes nothing",
            labels=["node_id"],
        )
        calls = self._node.loop_calls
        wakeups.add_metric([node_id], calls.wakeups if calls is not None else 0)
        yield wakeups

    def _term_rises(self, node_id: str) -> Iterator[_Family]:
        """Who raised each replica's term and why, and which rises deposed it as the leader
        (cluster/replication/term_record.py): an election a replica outside the voters caused
        shows as its own cause."""
        labels = ["node_id", "group_id", "cause", "peer"]
        rises = CounterMetricFamily(
            "raftmq_raft_term_rises",
            "Times this replica's term rose, by cause (its own campaign with or without a majority's "
            "pre-vote grants, a voter's or non-voter's vote request, a leader's append_entries) and "
            "the peer that brought it (its Raft address, or other)",
            labels=labels,
        )
        deposed = CounterMetricFamily(
            "raftmq_raft_leader_deposed",
            "Times this leader stepped down because a peer's message had a higher term, by cause and peer",
            labels=labels,
        )
        for name, local in list(self._node.groups.items()):
            for row in local.raft.terms.rows():
                key = [node_id, name, row.cause, row.peer]
                rises.add_metric(key, row.count)
                if row.deposed:
                    deposed.add_metric(key, row.deposed)
        yield from (rises, deposed)

    def _shared_bodies(self, node_id: str) -> Iterator[_Family]:
        """A leader's entries sealed once for several followers (cluster/replication/
        shared_bodies.py): the bodies, and the envelopes that sent them, one per follower."""
        labels = ["node_id", "group_id"]
        sealed = CounterMetricFamily(
            "raftmq_raft_shared_bodies_sealed",
            "Entries this replica sealed once as a leader for every follower that reads shared bodies",
            labels=labels,
        )
        envelopes = CounterMetricFamily(
            "raftmq_raft_shared_body_envelopes",
            "Shared bodies this replica sent as a leader, one per follower (more than the bodies "
            "sealed: a body served several followers)",
            labels=labels,
        )
        for name, local in list(self._node.groups.items()):
            bodies = local.raft.sealed_bodies
            sealed.add_metric([node_id, name], bodies.sealed if bodies is not None else 0)
            envelopes.add_metric([node_id, name], bodies.envelopes if bodies is not None else 0)
        yield from (sealed, envelopes)

    def _raft_connections(self, node_id: str) -> Iterator[_Family]:
        """Incoming Raft connections that have not authenticated, and those closed before they
        did, by reason (``cluster/replication/admission.py``), over all the node's Raft ports."""
        admission = self._node.raft_admission
        open_now = GaugeMetricFamily(
            "raftmq_raft_unauthenticated_connections",
            "Incoming Raft connections open and not authenticated yet",
            labels=["node_id"],
        )
        open_now.add_metric([node_id], admission.unauthenticated)
        closed = CounterMetricFamily(
            "raftmq_raft_connections_refused",
            "Incoming Raft connections closed before they authenticated, by reason",
            labels=["node_id", "reason"],
        )
        for reason, count in admission.closed().items():
            closed.add_metric([node_id, reason], count)
        yield from (open_now, closed)


class _StorageCollector(Collector):
    """RocksDB's background work (flushes, compactions) on each store of each replica here: what a
    burst of writes leaves behind after it was acknowledged (``storage/work.py``)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> Iterator[_Family]:
        labels = ["node_id", "group_id", "store"]
        families = {
            "pending_compaction_bytes": GaugeMetricFamily(
                "raftmq_rocksdb_pending_compaction_bytes",
                "Bytes RocksDB estimates its compactions must still rewrite (0: caught up)",
                labels=labels,
            ),
            "running_compactions": GaugeMetricFamily(
                "raftmq_rocksdb_running_compactions", "RocksDB compactions running now", labels=labels
            ),
            "running_flushes": GaugeMetricFamily(
                "raftmq_rocksdb_running_flushes", "RocksDB memtable flushes running now", labels=labels
            ),
            "level0_files": GaugeMetricFamily(
                "raftmq_rocksdb_level0_files",
                "Level-0 files (RocksDB slows writes at 20 and stops them at 36)",
                labels=labels,
            ),
            "delayed_write_rate": GaugeMetricFamily(
                "raftmq_rocksdb_delayed_write_rate_bytes",
                "Bytes/s RocksDB slows writes to while compactions catch up (0: writes not slowed)",
                labels=labels,
            ),
            "writes_stopped": GaugeMetricFamily(
                "raftmq_rocksdb_writes_stopped", "1 while RocksDB stops writes", labels=labels
            ),
            "blob_file_bytes": GaugeMetricFamily(
                "raftmq_rocksdb_blob_file_bytes",
                "Bytes of the blob files that hold the messages",
                labels=labels,
            ),
            "blob_garbage_bytes": GaugeMetricFamily(
                "raftmq_rocksdb_blob_garbage_bytes",
                "Bytes of deleted messages in blob files that compactions have already dropped",
                labels=labels,
            ),
        }
        node_id = self._node.me.id
        for name, local in list(self._node.groups.items()):
            for kind, store in (("state", local.state_store), ("raft", local.journal_store)):
                work = background_work(store)
                for field, family in families.items():
                    family.add_metric([node_id, name, kind], getattr(work, field))
        yield from families.values()


class _QueueCollector(Collector):
    """Queue depth and consumer progress, from the store of each queue group this node leads.

    Only the leader reports a group, once it serves reads (its state then holds every acknowledged
    write: ``leader_reads.py``), so summing a series over the nodes counts every queue once. See
    ``cluster/machines/views.py`` for what is read.
    """

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> Iterator[_Family]:
        q_labels = ["topic", "queue", "group_id"]
        c_labels = ["topic", "queue", "consumer_group"]
        queue = {
            "low": GaugeMetricFamily("raftmq_queue_low_offset", "First retained offset", labels=q_labels),
            "high": GaugeMetricFamily(
                "raftmq_queue_high_offset", "Next offset to be written", labels=q_labels
            ),
            "depth": GaugeMetricFamily(
                "raftmq_queue_messages", "Messages retained (high_offset - low_offset)", labels=q_labels
            ),
            "bytes": GaugeMetricFamily("raftmq_queue_retained_bytes", "Bytes retained", labels=q_labels),
        }
        appended = CounterMetricFamily(
            "raftmq_queue_appended_messages",
            "Messages appended to the queue (its high_offset)",
            labels=q_labels,
        )
        consumer = {
            "committed": GaugeMetricFamily(
                "raftmq_consumer_committed_offset", "Committed offset of the consumer group", labels=c_labels
            ),
            "lag": GaugeMetricFamily(
                "raftmq_consumer_lag_messages",
                "Messages not finished by the group: high_offset - committed offset",
                labels=c_labels,
            ),
            "in_flight": GaugeMetricFamily(
                "raftmq_subscription_in_flight_messages",
                "Received messages whose visibility deadline has not passed",
                labels=c_labels,
            ),
            "retrying": GaugeMetricFamily(
                "raftmq_subscription_retrying_messages", "Messages waiting for a retry", labels=c_labels
            ),
            "dlq": GaugeMetricFamily(
                "raftmq_subscription_dead_letters",
                "Messages in the group's dead-letter queue not redriven yet",
                labels=c_labels,
            ),
        }
        names = self._topic_names()
        for gid, local in list(self._node.groups.items()):
            # The leader's figures, once it serves reads (leader_reads.py): a new leader's replica
            # may lack acknowledged messages, a counter going back.
            if gid == META or not local.raft.reads.ready():
                continue
            store = local.machine.store
            try:
                metas = queue_metas(store)
                rows = consumer_queues(store)
            except StoreError:  # the store is being swapped for a restored checkpoint
                continue
            for (topic_id, q), meta in metas.items():
                key = [names.get(topic_id, f"#{topic_id}"), str(q), gid]
                queue["low"].add_metric(key, meta.low_offset)
                queue["high"].add_metric(key, meta.high_offset)
                queue["depth"].add_metric(key, meta.high_offset - meta.low_offset)
                queue["bytes"].add_metric(key, meta.retained_bytes)
                appended.add_metric(key, meta.high_offset)
            for row in rows:
                key = [names.get(row.topic_id, f"#{row.topic_id}"), str(row.queue), row.group]
                if row.committed_offset is not None:
                    consumer["committed"].add_metric(key, row.committed_offset)
                consumer["lag"].add_metric(key, row.lag)
                consumer["in_flight"].add_metric(key, row.in_flight)
                consumer["retrying"].add_metric(key, row.retrying)
                consumer["dlq"].add_metric(key, row.dead_letters)
        yield from queue.values()
        yield appended
        yield from consumer.values()

    def _topic_names(self) -> dict[int, str]:
        machine = self._node.metadata  # None on a node that is not a metadata voter
        return {} if machine is None else {t.id: t.name for t in machine.topics()}


class ReadAheadCollector(Collector):
    """The messages this node's SQS deletes read ahead, by what became of them
    (``cluster/node/read_ahead.py``)."""

    def __init__(self, node: Node, counts: ReadAheadCounts) -> None:
        self._node = node  # its id read when collected, as the other collectors do
        self._counts = counts

    def collect(self) -> Iterator[_Family]:
        family = CounterMetricFamily(
            "raftmq_read_ahead_messages",
            "Messages the SQS API's deletes on this node took in flight for its next receives "
            "(taken), or its sends for a receive waiting here (taken_by_send), then handed out "
            "with no entry of their own (handed_out), gave back "
            "uncounted (released), or could not give back (unreleased: visible again at their "
            "visibility deadline, counted as received once)",
            labels=["node_id", "outcome"],
        )
        c = self._counts
        for outcome, n in (
            ("taken", c.taken),
            ("taken_by_send", c.taken_by_send),
            ("handed_out", c.handed_out),
            ("released", c.released),
            ("unreleased", c.unreleased),
        ):
            family.add_metric([self._node.me.id, outcome], n)
        yield family


class BarrierCollector(Collector):
    """The read barriers of this node's led groups (``cluster/node/barriers.py``): the reads that
    waited for one, and the ``noop`` entries proposed for them (fewer: reads waiting at once
    share one)."""

    def __init__(self, node: Node, counts: BarrierCounts) -> None:
        self._node = node
        self._counts = counts

    def collect(self) -> Iterator[_Family]:
        labels = ["node_id", "group_id"]
        reads = CounterMetricFamily(
            "raftmq_read_barrier_reads", "Linearizable reads that waited for a barrier entry", labels=labels
        )
        entries = CounterMetricFamily(
            "raftmq_read_barrier_entries",
            "Barrier (noop) entries proposed for linearizable reads; reads waiting at once share one",
            labels=labels,
        )
        for family, counts in ((reads, self._counts.reads), (entries, self._counts.entries)):
            for group, n in sorted(counts.items()):
                family.add_metric([self._node.me.id, group], n)
        yield reads
        yield entries


class WaitingReceiversCollector(Collector):
    """The receivers waiting in the lines this node serves (``cluster/node/receive_coordinator.py``):
    a line's coordinator counts the receives forwarded to it from the other nodes too."""

    def __init__(self, node: Node, waiting: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._node = node
        self._waiting = waiting

    def collect(self) -> Iterator[_Family]:
        family = GaugeMetricFamily(
            "raftmq_receivers_waiting",
            "Receives (HTTP long polls, push streams, SQS ReceiveMessage) waiting in the lines this "
            "node serves, by topic and consumer group",
            labels=["node_id", "topic", "consumer_group"],
        )
        for (topic, group), n in sorted(self._waiting().items()):
            family.add_metric([self._node.me.id, topic, group], n)
        yield family


class Metrics:
    """The node's metric registry (one per application, no module-level state)."""

    def __init__(self, node: Node) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "raftmq_http_requests",
            "HTTP requests by route and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "raftmq_http_request_seconds",
            "HTTP request latency by route",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.produced = Counter(
            "raftmq_produced_messages",
            "Messages acknowledged by produce requests on this node",
            registry=self.registry,
        )
        self.fetched = Counter(
            "raftmq_fetched_messages",
            "Messages returned by fetch requests on this node",
            registry=self.registry,
        )
        self.malformed = Counter(
            "raftmq_http_malformed_requests",
            "HTTP requests the parser refused as malformed (answered 400; cluster/api/server_log.py)",
            registry=self.registry,
        )
        self.idle_closed = Counter(
            "raftmq_http_idle_connections_closed",
            "HTTP connections with no request under way closed over limits.http_max_idle_connections",
            registry=self.registry,
        )
        self.write_timeouts = Counter(
            "raftmq_http_write_timeouts",
            "HTTP connections aborted because an answer or push frame stayed unsent for"
            " limits.http_write_timeout_ms (a client that does not read)",
            registry=self.registry,
        )
        self.registry.register(_RaftCollector(node))
        self.registry.register(_QueueCollector(node))
        self.registry.register(_StorageCollector(node))
        # (method, route, status) -> its children of ``requests`` and ``latency``: ``labels()``
        # builds a tuple of strings and takes a lock per call; the children never change.
        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one HTTP request and its latency (``route``: its route's pattern)."""
        if method not in hdrs.METH_ALL:  # a client's own token (a pure-Python parser takes any)
            method = "OTHER"
        key = (method, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
        children[0].inc()
        children[1].observe(seconds)


METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)


@web.middleware
async def metrics_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    start = time.perf_counter()
    response = await handler(request)
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "unmatched"
    request.app[METRICS_KEY].observe_request(
        request.method, route, response.status, time.perf_counter() - start
    )
    return response


async def metrics_handler(request: web.Request) -> web.Response:
    # Off the event loop: the collectors read every led queue group's store.
    registry = request.app[METRICS_KEY].registry
    body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
