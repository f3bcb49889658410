"""The cluster file: one frozen configuration, loaded once, validated with every problem listed.

A cluster file is TOML::

    [cluster]
    secret = "at least 16 characters"   # Raft peer encryption and node-to-node calls
    queue_groups = 3                     # default: one per node
    replication = 3                      # replicas per queue group (default: min(3, nodes))
    durability = "fsync"                 # or "os"

    [limits]                             # optional; defaults shown in Limits
    max_message_bytes = 1048576

    [raft]                               # optional timing; defaults in RaftTimingConfig
    election_min_ms = 1000

    [delivery]                           # optional receive/ack settings; defaults in DeliveryConfig
    max_deliveries = 16
    backoff_ms = [10000, 30000, 60000]   # env: RAFTMQ_DELIVERY_BACKOFF_MS=10000,30000,60000

    [segments]                           # optional segment sealing; defaults in SegmentsConfig
    store = "s3://bucket/raftmq"         # default: <data_dir>/<node_id>/segments

    [security]                           # optional API tokens (cluster/config/tokens.py, docs/security.md)
    allow_unauthenticated = false        # without tokens, `raftmq serve` refuses a non-loopback
                                         # HTTP address unless true (cluster/cli/serve.py)
    [[security.tokens]]
    name = "orders-service"
    sha256 = "<64 hex digits>"           # or token = "..."; env: RAFTMQ_TOKEN_ORDERS_SERVICE
    produce = ["orders.*"]

    [sqs]                                # optional; the SQS API (docs/sqs.md)
    region = "us-east-1"                 # the region of queue ARNs and of SigV4 credential scopes

    [tls]                                # optional HTTPS for the API and node-to-node calls
    cert_file = "/etc/raftmq/node.pem"   # default for every node (per node: tls_cert_file)
    key_file = "/etc/raftmq/node.key"    # (per node: tls_key_file)
    ca_file = "/etc/raftmq/ca.pem"       # the CA peers' certificates are checked against
    verify = true

    [[nodes]]
    id = "n1"
    http = "127.0.0.1:8001"
    raft = "127.0.0.1:7001"              # base port: the metadata group uses it, queue group g uses +1+g
    raft_bind = "127.0.0.1"              # optional host the Raft ports listen on (default: raft's host)
    data_dir = ".raftmq"                 # this node keeps its data under <data_dir>/<id>/
    join = false                         # true: added to a running cluster later (docs/operations.md)

Placement: at the first start the metadata group records the placement computed from this file
(``group_replicas``, nodes with ``join = true`` left out); from then on the metadata group's
placement (``cluster/machines/placement.py``) is the truth, and a node sees it as the ``replica_map`` and node
list of its ``ClusterConfig``.

Environment variables override single settings: ``RAFTMQ_<SECTION>_<KEY>`` (for example
``RAFTMQ_CLUSTER_DURABILITY=os``, ``RAFTMQ_LIMITS_MAX_MESSAGE_BYTES=2097152``) and
``RAFTMQ_SECRET`` for ``cluster.secret``.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from raftmq.cluster.base.limits import (
    DEFAULT_BACKOFF_MS,
    DEFAULT_MAX_MEMBERS_PER_TOKEN,
    DEFAULT_MAX_MEMBERS_PER_TOPIC,
    MAX_DURATION_MS,
    MAX_PRODUCER_STATES,
    MAX_REQUEST_BYTES_CEILING,
    MAX_TOPICS_PER_ENTRY,
)
from raftmq.cluster.config.nodes import NodeConfig, parse_nodes
from raftmq.cluster.config.raft_timing import RaftTimingConfig
from raftmq.cluster.config.tokens import SecurityConfig, parse_security
from raftmq.errors import RaftmqError

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "DeliveryConfig",
    "Limits",
    "NodeConfig",
    "RaftTimingConfig",
    "SegmentsConfig",
    "SqsConfig",
    "TestFaults",
    "TlsConfig",
    "load_config",
    "parse_config",
]

MAX_METADATA_VOTERS = 5


class ConfigError(RaftmqError):
    """The cluster file is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid cluster configuration:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 1024 * 1024
    max_request_bytes: int = 4 * 1024 * 1024
    max_messages_per_request: int = 10_000
    max_fetch_messages: int = 10_000
    default_fetch_messages: int = 32
    max_wait_ms: int = 15_000
    max_queues_per_topic: int = 1024
    # Topics one POST /v1/topics with a "topics" list creates (one metadata entry); more is 413
    # request_too_large.
    max_topics_per_request: int = 1000
    request_timeout_ms: int = 10_000
    max_delay_ms: int = 7 * 24 * 3600 * 1000  # delay_ms / deliver_at_ms of a produced message
    max_ttl_ms: int = 10 * 365 * 24 * 3600 * 1000  # ttl_ms of a produced message
    default_visibility_ms: int = 30_000  # receive: how long a message stays in flight
    max_visibility_ms: int = 12 * 3600 * 1000  # receive and extend
    # An idempotent producer's state on a queue not used for this long is forgotten (0: kept
    # forever); a retry later than this may be stored again (cluster/machines/producers.py).
    producer_idle_ms: int = 7 * 24 * 3600 * 1000
    # The most idempotent producer states a queue group keeps (0: no cap); a new one past it
    # forgets the least recently used (cluster/machines/producers.py). Sent with the expiry.
    max_producer_states: int = 100_000
    # Every node samples each consumer group's lag this often for the console's charts
    # (cluster/node/lag_history.py; the last 15 minutes are kept).
    lag_sample_ms: int = 10_000
    # Consumer groups that consume rights create (docs/delivery.md, "Subscriptions and their
    # bounds"): a subscription that receives made and no admin configured is dropped with its
    # receive/ack state after this long unused (0: kept forever; at least max_visibility_ms).
    subscription_idle_ms: int = 24 * 3600 * 1000
    # The committed offsets of such a group (an offset commit makes one too, as a receive does) are
    # dropped, with the group, after this long unused: not committed, not read, not received
    # under (0: kept forever; at least subscription_idle_ms). Kafka's offsets.retention.minutes.
    offset_retention_ms: int = 7 * 24 * 3600 * 1000
    # The most such groups per topic, and per token (each counted in each queue group of the
    # topic); a receive that would make one more answers 409 too_many_groups (0: no cap).
    max_groups_per_topic: int = 1000
    max_groups_per_token: int = 100
    # Consumer-group members (cluster/machines/membership.py) one API token may have, and one topic
    # may have, at once over all groups; a join beyond either is 409 too_many_members.
    max_members_per_token: int = DEFAULT_MAX_MEMBERS_PER_TOKEN
    max_members_per_topic: int = DEFAULT_MAX_MEMBERS_PER_TOPIC
    # Incoming Raft connections that have not authenticated (named a node of the group in frames
    # sealed with the Raft key): closed this long after they were accepted, and at most this many
    # per node (all its Raft ports) and per source address; over a cap a new one is closed at once.
    raft_auth_timeout_ms: int = 5_000
    raft_max_unauthenticated: int = 512
    raft_max_unauthenticated_per_source: int = 64
    # What HTTP clients may hold: idle connections, unsent answers, requests (docs/operations.md).
    http_idle_timeout_ms: int = 75_000
    http_max_idle_connections: int = 1024
    http_write_timeout_ms: int = 30_000
    http_max_requests: int = 4096
    # Store values each queue group's apply keeps decoded between entries (cluster/machines/cache.py;
    # about 0.8 KiB each when full of producer states, per group hosted; 0: off).
    apply_cache_entries: int = 4096


@dataclass(frozen=True)
class DeliveryConfig:
    """Receive/ack defaults (``docs/delivery.md``). ``max_deliveries`` and ``backoff_ms`` are the
    settings a new subscription gets (``PUT .../subscriptions/{group}`` changes them per group)."""

    max_deliveries: int = 16
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS  # RocketMQ's levels from 10 s to 2 h
    # A leader's delivery loop sleeps until the next due time it knows, at most 1 s less this (an
    # apply that does not wake it schedules nothing sooner than 1 s), and is late by at most this.
    tick_ms: int = 200
    tick_max_items: int = 1000  # delayed messages and deadlines one deliver_tick handles (each)
    # An expired delivery waits its group's backoff before it is available again (the rule before
    # issue 21; for a rolling upgrade from it). False: it is available at its deadline.
    expiry_backoff: bool = False


@dataclass(frozen=True)
class SegmentsConfig:
    """Segment sealing (``cluster/machines/segments.py``, ``docs/spark.md``). A queue group's leader seals a
    queue's committed messages after its last segment once there are ``max_messages`` of them, or
    ``max_bytes`` stored, or the oldest is ``max_age_ms`` old (0: no age trigger)."""

    enabled: bool = True
    store: str = ""  # "" = <data_dir>/<node_id>/segments; or a directory or pyarrow URI ({node_id})
    max_messages: int = 262_144
    max_bytes: int = 64 * 1024 * 1024
    max_age_ms: int = 0
    parquet: bool = True  # also write Parquet (for plain spark.read.parquet)
    check_ms: int = 2_000  # how often the leader looks for ranges to seal
    gc_interval_ms: int = 30_000  # how often a node deletes its dead segment files
    gc_grace_ms: int = 600_000  # an unlisted file younger than this is kept (its seal may be in flight)


@dataclass(frozen=True)
class TestFaults:
    """Faults for tests only (never set them in production)."""

    crash_after_snapshot: bool = False
    # Answer produce requests before their entry is replicated (the chaos suite's mutation check:
    # with it, leader kills must show up as lost messages).
    ack_before_replication: bool = False
    # While this file says "fail", checkpoint fetches for snapshot installs fail; while it says
    # "stall", each waits (up to 60 s) and then fails (the chaos suite's checkpoint-fetch fault).
    checkpoint_fetch_fault_file: str = ""
    # A node sending a checkpoint archive waits this long before each chunk (about 1 MiB) of it: a
    # slow disk, so a large state's archive takes longer than a fetch's timeout to send.
    checkpoint_send_chunk_delay_ms: int = 0
    # The node with this id plays a node of the version before record-batch format 2: it
    # advertises format 1 only and refuses forwarded binary appends as that version did
    # (invalid_json). The rolling-upgrade test: its groups' leaders must propose JSON commands,
    # and nodes forwarding to it must send JSON.
    v1_only_node: str = ""
    # The node with this id plays a node of the release before capabilities (docs/operations.md,
    # "Rolling upgrades"): its status advertises none, so its groups' leaders must not write the
    # ops and fields that release lacked (expire_subscriptions, subscribe's newer fields, the
    # metadata group's record_dead_letters), and its own queue-group replicas refuse those ops.
    previous_release_node: str = ""


@dataclass(frozen=True)
class SqsConfig:
    """The SQS API (``cluster/api/sqs/``, ``docs/sqs.md``): ``region`` is the region of the queue
    ARNs it answers and, on a cluster with tokens, the only region a SigV4 signature may be scoped to."""

    region: str = "us-east-1"
    # A message move task whose heartbeat (every second) is older than this is FAILED, and the
    # messages its node took are held in flight this long (a node that dies mid-task). At least
    # 10 s: the heartbeat is written between batches, and a batch's append or the heartbeat's
    # write can outlast a few seconds across an election; a live task shown FAILED would let a
    # second one start while its messages come back mid-append (duplicates).
    move_task_lease_ms: int = 30_000


@dataclass(frozen=True)
class TlsConfig:
    """HTTPS settings shared by the nodes (``docs/security.md``). ``cert_file``/``key_file`` are the
    default of every node's ``tls_cert_file``/``tls_key_file``; ``ca_file`` is what peers'
    certificates are verified against ("" = the system's CAs); ``verify = false`` turns the
    verification of peers off (never in production)."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    verify: bool = True


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    secret: str = field(repr=False)
    queue_groups: int
    replication: int
    durability: str = "fsync"
    limits: Limits = field(default_factory=Limits)
    raft: RaftTimingConfig = field(default_factory=RaftTimingConfig)
    faults: TestFaults = field(default_factory=TestFaults)
    path: str | None = None
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    segments: SegmentsConfig = field(default_factory=SegmentsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    sqs: SqsConfig = field(default_factory=SqsConfig)
    # The metadata group's placement once known (cluster/machines/placement.py): group name ("meta", "0",
    # ...) -> node ids, preferred leader first. None: the first placement, computed from the file.
    replica_map: Mapping[str, tuple[str, ...]] | None = None

    @property
    def tls_enabled(self) -> bool:
        return any(n.tls_cert_file for n in self.nodes)

    def node(self, node_id: str) -> NodeConfig:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    @property
    def bootstrap_nodes(self) -> tuple[NodeConfig, ...]:
        """The nodes of the first placement: those not marked ``join``."""
        return tuple(n for n in self.nodes if not n.join)

    @property
    def metadata_voters(self) -> tuple[NodeConfig, ...]:
        """The metadata group's replicas; first placement: the first (up to) five bootstrap nodes."""
        if self.replica_map is not None:
            return tuple(self.node(i) for i in self.replica_map.get("meta", ()))
        return self.bootstrap_nodes[:MAX_METADATA_VOTERS]

    def group_replicas(self, group_id: int) -> tuple[NodeConfig, ...]:
        """Nodes hosting queue group ``group_id``, the preferred leader first. First placement:
        ``replication`` consecutive bootstrap nodes starting at ``group_id`` (mod their count), so
        replicas are distinct and preferred leaders (the first replica) are spread over the nodes."""
        if self.replica_map is not None:
            return tuple(self.node(i) for i in self.replica_map.get(str(group_id), ()))
        nodes = self.bootstrap_nodes
        return tuple(nodes[(group_id + i) % len(nodes)] for i in range(self.replication))

    def groups_on(self, node_id: str) -> list[int]:
        return [g for g in range(self.queue_groups) if any(r.id == node_id for r in self.group_replicas(g))]


def load_config(path: str, env: Mapping[str, str] | None = None) -> ClusterConfig:
    """Read, override from the environment and validate a cluster file."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([f"cluster file not found: {path}"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    return parse_config(raw, env=os.environ if env is None else env, path=path)


def parse_config(
    raw: dict[str, Any], env: Mapping[str, str] | None = None, path: str | None = None
) -> ClusterConfig:
    problems: list[str] = []
    env = env or {}
    cluster = dict(raw.get("cluster", {}))
    if "RAFTMQ_SECRET" in env:
        cluster["secret"] = env["RAFTMQ_SECRET"]
    _apply_env(
        cluster,
        "CLUSTER",
        env,
        {"secret": str, "queue_groups": int, "replication": int, "durability": str},
        problems,
    )
    unknown = set(raw) - {
        *("cluster", "limits", "raft", "nodes", "faults", "delivery", "segments", "security", "tls", "sqs")
    }
    problems += [f"unknown section [{k}]" for k in sorted(unknown)]

    nodes = parse_nodes(raw.get("nodes"), problems)
    secret = cluster.get("secret")
    if not isinstance(secret, str) or len(secret) < 16:
        problems.append("cluster.secret must be a string of at least 16 characters (or set RAFTMQ_SECRET)")
    n = len([node for node in nodes if not node.join])
    queue_groups = cluster.get("queue_groups", n)
    replication = cluster.get("replication", min(3, n) if n else 1)
    durability = cluster.get("durability", "fsync")
    if not _is_int(queue_groups) or queue_groups < 1 or queue_groups > 256:
        problems.append("cluster.queue_groups must be an integer from 1 to 256")
    if not _is_int(replication) or replication < 1:
        problems.append("cluster.replication must be a positive integer")
    elif n and replication > n:
        problems.append(f"cluster.replication ({replication}) exceeds the node count ({n}, join excluded)")
    if durability not in ("fsync", "os"):
        problems.append('cluster.durability must be "fsync" or "os"')
    unknown_keys = set(cluster) - {"secret", "queue_groups", "replication", "durability", "name"}
    problems += [f"unknown key cluster.{k}" for k in sorted(unknown_keys)]

    limits = _parse_section(Limits, raw.get("limits", {}), "limits", env, problems)
    timing = _parse_section(RaftTimingConfig, raw.get("raft", {}), "raft", env, problems)
    faults = _parse_section(TestFaults, raw.get("faults", {}), "faults", env, problems)
    delivery = _parse_section(DeliveryConfig, raw.get("delivery", {}), "delivery", env, problems)
    segments = _parse_section(SegmentsConfig, raw.get("segments", {}), "segments", env, problems)
    security = parse_security(raw.get("security"), env, problems)
    tls = _parse_section(TlsConfig, raw.get("tls", {}), "tls", env, problems)
    sqs = _parse_section(SqsConfig, raw.get("sqs", {}), "sqs", env, problems)
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", sqs.region) or len(sqs.region) > 32:
        problems.append('sqs.region must be an AWS-style region name such as "us-east-1"')
    if not 10_000 <= sqs.move_task_lease_ms <= 3_600_000:
        problems.append("sqs.move_task_lease_ms must be from 10000 (10 s) to 3600000 (an hour)")
    nodes = _with_tls(nodes, tls, problems)
    if segments.max_messages < 1 or segments.max_bytes < 1 or segments.check_ms < 1:
        problems.append("segments.max_messages, max_bytes and check_ms must be at least 1")
    if delivery.max_deliveries < 1 or delivery.tick_ms < 1 or delivery.tick_max_items < 1:
        problems.append("delivery.max_deliveries, tick_ms and tick_max_items must be at least 1")
    if not delivery.backoff_ms or len(delivery.backoff_ms) > 64:
        problems.append("delivery.backoff_ms must list 1 to 64 delays")
    if limits.default_visibility_ms < 1 or limits.default_visibility_ms > limits.max_visibility_ms:
        problems.append("limits.default_visibility_ms must be from 1 to limits.max_visibility_ms")
    if not 100 <= limits.lag_sample_ms <= 60_000:
        problems.append("limits.lag_sample_ms must be from 100 to 60000")
    if limits.subscription_idle_ms and not (
        limits.max_visibility_ms <= limits.subscription_idle_ms <= MAX_DURATION_MS
    ):
        problems.append(
            "limits.subscription_idle_ms must be 0 (never) or from limits.max_visibility_ms "
            f"to {MAX_DURATION_MS}"
        )
    if limits.offset_retention_ms and not (
        max(limits.max_visibility_ms, limits.subscription_idle_ms)
        <= limits.offset_retention_ms
        <= MAX_DURATION_MS
    ):
        problems.append(
            "limits.offset_retention_ms must be 0 (never) or from limits.subscription_idle_ms "
            f"(and limits.max_visibility_ms) to {MAX_DURATION_MS}"
        )
    if (
        not 0 <= limits.max_groups_per_topic <= 0xFFFF_FFFF
        or not 0 <= limits.max_groups_per_token <= 0xFFFF_FFFF
    ):
        problems.append(
            "limits.max_groups_per_topic and max_groups_per_token must be from 0 (no cap) to 2**32-1"
        )
    if limits.max_members_per_token < 1 or limits.max_members_per_topic < 1:
        problems.append("limits.max_members_per_token and max_members_per_topic must be at least 1")
    if not 1 <= limits.max_request_bytes <= MAX_REQUEST_BYTES_CEILING:
        problems.append(
            f"limits.max_request_bytes must be from 1 to {MAX_REQUEST_BYTES_CEILING} (32 MiB): a larger "
            "entry would make Raft messages longer than a follower accepts"
        )
    if not 1 <= limits.max_topics_per_request <= MAX_TOPICS_PER_ENTRY:
        problems.append(f"limits.max_topics_per_request must be from 1 to {MAX_TOPICS_PER_ENTRY}")
    if not 100 <= limits.raft_auth_timeout_ms <= 60_000:
        problems.append("limits.raft_auth_timeout_ms must be from 100 to 60000")
    for name in (f.name for f in fields(limits) if f.name.startswith("http_")):
        least, most = (1_000, 3_600_000) if name.endswith("_ms") else (1, 10**6)
        if not least <= getattr(limits, name) <= most:
            problems.append(f"limits.{name} must be from {least} to {most}")
    if limits.raft_max_unauthenticated < 1 or limits.raft_max_unauthenticated_per_source < 1:
        problems.append(
            "limits.raft_max_unauthenticated and raft_max_unauthenticated_per_source must be at least 1"
        )
    if limits.producer_idle_ms > MAX_DURATION_MS:
        problems.append(f"limits.producer_idle_ms must be at most {MAX_DURATION_MS} (0: never forget)")
    if not 0 <= limits.max_producer_states <= MAX_PRODUCER_STATES:
        problems.append(f"limits.max_producer_states must be from 0 (no cap) to {MAX_PRODUCER_STATES}")
    if not 0 <= timing.retention_max_jump_ms <= MAX_DURATION_MS:
        problems.append("raft.retention_max_jump_ms must be from 0 (off) to 2**40")
    if not 0 <= timing.retention_max_batches <= 0xFFFF_FFFF:
        problems.append("raft.retention_max_batches must be from 0 (off) to 4294967295")
    if not 64 * 1024 <= timing.max_follower_backlog_bytes <= 1 << 30:
        problems.append("raft.max_follower_backlog_bytes must be from 65536 to 1073741824 (1 GiB)")
    if faults.checkpoint_send_chunk_delay_ms < 0:
        problems.append("faults.checkpoint_send_chunk_delay_ms must be at least 0")
    if not 0 <= limits.apply_cache_entries <= 1_000_000:
        problems.append("limits.apply_cache_entries must be from 0 (off) to 1000000")
    if not 100 <= timing.checkpoint_io_timeout_ms <= 3_600_000:
        problems.append("raft.checkpoint_io_timeout_ms must be from 100 to 3600000 (an hour)")
    if timing.election_min_ms >= timing.election_max_ms:
        problems.append("raft.election_min_ms must be below raft.election_max_ms")
    if timing.heartbeat_ms * 5 > timing.election_min_ms:
        problems.append("raft.heartbeat_ms must be at most a fifth of raft.election_min_ms")
    if problems:
        raise ConfigError(problems)
    return ClusterConfig(
        nodes=tuple(nodes),
        secret=str(secret),
        queue_groups=int(queue_groups),
        replication=int(replication),
        durability=str(durability),
        limits=limits,
        raft=timing,
        faults=faults,
        path=path,
        delivery=delivery,
        segments=segments,
        security=security,
        tls=tls,
        sqs=sqs,
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _with_tls(nodes: list[NodeConfig], tls: TlsConfig, problems: list[str]) -> list[NodeConfig]:
    """Nodes with [tls]'s cert_file/key_file where they set none; HTTPS is all nodes or none."""
    out = [
        replace(
            n, tls_cert_file=n.tls_cert_file or tls.cert_file, tls_key_file=n.tls_key_file or tls.key_file
        )
        for n in nodes
    ]
    for n in out:
        if bool(n.tls_cert_file) != bool(n.tls_key_file):
            problems.append(f"node {n.id}: TLS needs both a certificate and a key file")
    if len({bool(n.tls_cert_file) for n in out}) > 1:
        problems.append("TLS must be set for every node or for none (peers call each other by URL)")
    return out


def _apply_env(
    section: dict[str, Any], name: str, env: Mapping[str, str], types: Mapping[str, type], problems: list[str]
) -> None:
    for key, typ in types.items():
        var = f"RAFTMQ_{name}_{key.upper()}"
        if var not in env:
            continue
        value = env[var]
        if typ is bool:
            section[key] = value.lower() in ("1", "true", "yes", "on")
        elif typ is tuple:
            try:
                section[key] = [int(v) for v in value.split(",") if v.strip()]
            except ValueError:
                problems.append(f"{var} must be comma-separated integers, got {value!r}")
        elif typ is int:
            try:
                section[key] = int(value)
            except ValueError:
                problems.append(f"{var} must be an integer, got {value!r}")
        else:
            section[key] = value


def _parse_section(cls: Any, raw: Any, name: str, env: Mapping[str, str], problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        problems.append(f"[{name}] must be a table")
        return cls()
    values = dict(raw)
    defaults = cls()
    types = {f.name: type(getattr(defaults, f.name)) for f in fields(cls)}
    _apply_env(values, name.upper(), env, types, problems)
    result = cls()
    for key, value in values.items():
        if key not in types:
            problems.append(f"unknown key {name}.{key}")
            continue
        want = types[key]
        if want is tuple:
            if not isinstance(value, list) or not all(_is_int(v) and v >= 0 for v in value):
                problems.append(f"{name}.{key} must be a list of non-negative integers")
                continue
            value = tuple(value)
        elif want is str:
            if not isinstance(value, str):
                problems.append(f"{name}.{key} must be a string")
                continue
        elif not (isinstance(value, bool) if want is bool else _is_int(value) and value >= 0):
            problems.append(
                f"{name}.{key} must be {'true or false' if want is bool else 'a non-negative integer'}"
            )
            continue
        result = replace(result, **{key: value})
    return result
