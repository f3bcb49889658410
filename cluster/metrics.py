"""Prometheus metrics of a node (``GET /metrics``).

Request counts and latencies are counted by a middleware. Raft and storage figures are read from the
node when Prometheus scrapes (a custom collector), so the produce path and the tick threads pay
nothing for them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .node import Node

__all__ = ["METRICS_KEY", "Metrics", "metrics_handler", "metrics_middleware"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15)


class _NodeCollector(Collector):
    """Per-group Raft state and journal fsync figures, read at scrape time."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["node_id", "group"]
        term = GaugeMetricFamily("raftmq_raft_term", "Current Raft term of the replica", labels=labels)
        leader = GaugeMetricFamily(
            "raftmq_raft_is_leader", "1 if this replica leads its group", labels=labels
        )
        commit = GaugeMetricFamily("raftmq_raft_commit_index", "Raft commit index", labels=labels)
        applied = GaugeMetricFamily(
            "raftmq_raft_applied_index", "Raft index applied by pysyncobj", labels=labels
        )
        lag = GaugeMetricFamily(
            "raftmq_raft_apply_lag_entries",
            "Committed entries not yet applied on this replica",
            labels=labels,
        )
        journal = GaugeMetricFamily(
            "raftmq_journal_entries", "Entries retained in the journal", labels=labels
        )
        journal_bytes = GaugeMetricFamily("raftmq_journal_bytes", "Bytes of retained commands", labels=labels)
        leader_changes = CounterMetricFamily(
            "raftmq_raft_became_leader", "Times this replica became leader", labels=labels
        )
        syncs = CounterMetricFamily("raftmq_journal_fsyncs", "Journal fsyncs", labels=labels)
        sync_seconds = CounterMetricFamily(
            "raftmq_journal_fsync_seconds", "Time spent in journal fsyncs", labels=labels
        )
        node_id = self._node.me.id
        for name, local in list(self._node.groups.items()):
            s = local.raft.status()
            stats = local.raft.journal_stats()
            key = [node_id, name]
            term.add_metric(key, s.term)
            leader.add_metric(key, 1 if s.is_leader else 0)
            commit.add_metric(key, s.commit_index)
            applied.add_metric(key, s.applied_index)
            lag.add_metric(key, max(0, s.commit_index - s.applied_index))
            journal.add_metric(key, s.journal_entries)
            journal_bytes.add_metric(key, stats["bytes"])
            leader_changes.add_metric(key, local.raft.became_leader_count)
            syncs.add_metric(key, stats["syncs"])
            sync_seconds.add_metric(key, stats["sync_seconds"])
        yield from (
            term,
            leader,
            commit,
            applied,
            lag,
            journal,
            journal_bytes,
            leader_changes,
            syncs,
            sync_seconds,
        )


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
        self.registry.register(_NodeCollector(node))


METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)


@web.middleware
async def metrics_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    start = time.perf_counter()
    response = await handler(request)
    metrics = request.app[METRICS_KEY]
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "unmatched"
    metrics.requests.labels(request.method, route, str(response.status)).inc()
    metrics.latency.labels(request.method, route).observe(time.perf_counter() - start)
    return response


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
