"""The consumer's settings and the names shared by the consumer modules."""

from __future__ import annotations

import ssl as _ssl
from dataclasses import dataclass, field
from typing import Literal

from ._limits import MAX_MESSAGES, MAX_NAME_BYTES, MAX_WAIT_MS
from ._transport import AddressMap

__all__ = ["MAX_NAME_BYTES", "ConsumerConfig", "FetchWire", "Mode", "Reset", "TopicQueue"]

FetchWire = Literal["binary", "json"]
Mode = Literal["clustering", "broadcast"]
Reset = Literal["earliest", "latest"]
TopicQueue = tuple[str, int]


def _name_ok(name: str) -> bool:
    try:
        return 1 <= len(name.encode()) <= MAX_NAME_BYTES
    except UnicodeEncodeError:  # a lone surrogate
        return False


@dataclass(frozen=True)
class ConsumerConfig:
    """The consumer's settings (see :class:`~raftmq.client.AsyncConsumer` for their meaning)."""

    group: str
    topics: tuple[str, ...]
    mode: Mode = "clustering"
    member_id: str | None = None
    max_batch: int = 32  # the design's default; throughput-bound consumers raise it (500 in bench_consume)
    wait_ms: int = 5_000
    max_backlog: int = 2_000
    max_fetches_in_flight: int = 4
    auto_commit_interval_ms: int = 1_000
    reset: Reset = "earliest"
    auto_ack: bool = False
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 2_000
    metadata_max_age_ms: int = 30_000
    wire: FetchWire = "binary"  # fetch stored batches (docs/format.md); "json": the JSON answer
    address_map: AddressMap | None = None  # where to connect for a node's advertised address
    token: str | None = field(default=None, repr=False)  # API token (never in a repr)
    ca_file: str | None = None
    ssl: _ssl.SSLContext | None = None

    def check(self) -> None:
        problems = []
        if not _name_ok(self.group):
            problems.append(f"group must be 1-{MAX_NAME_BYTES} UTF-8 bytes")
        if not self.topics:
            problems.append("subscribe to at least one topic")
        if self.mode not in ("clustering", "broadcast"):
            problems.append("mode must be 'clustering' or 'broadcast'")
        if self.mode == "broadcast" and self.member_id is None:
            problems.append(
                "broadcast mode needs a stable member_id: its progress is committed as "
                "'<group>.<member_id>' and resumes from there after a restart"
            )
        if self.member_id is not None and not _name_ok(self.member_id):
            problems.append(f"member_id must be 1-{MAX_NAME_BYTES} UTF-8 bytes")
        elif self.mode == "broadcast" and not _name_ok(self.commit_group):
            problems.append(f"'<group>.<member_id>' must be at most {MAX_NAME_BYTES} UTF-8 bytes")
        if self.wire not in ("binary", "json"):
            problems.append("wire must be 'binary' or 'json'")
        if self.reset not in ("earliest", "latest"):
            problems.append("reset must be 'earliest' or 'latest'")
        if not 1 <= self.max_batch <= MAX_MESSAGES:
            problems.append(f"max_batch must be from 1 to {MAX_MESSAGES:,}")
        if not 0 <= self.wait_ms <= MAX_WAIT_MS:
            problems.append(f"wait_ms must be from 0 to {MAX_WAIT_MS:,}")
        if self.max_backlog < self.max_batch:
            problems.append("max_backlog must be at least max_batch")
        if self.max_fetches_in_flight < 1:
            problems.append("max_fetches_in_flight must be at least 1")
        if self.auto_commit_interval_ms <= 0:
            problems.append("auto_commit_interval_ms must be positive")
        if problems:
            raise ValueError("invalid consumer settings: " + "; ".join(problems))

    @property
    def commit_group(self) -> str:
        """The consumer group offsets are committed under: ``group``, or in broadcast mode
        ``group.member_id`` (each broadcast consumer has its own progress)."""
        return self.group if self.mode == "clustering" else f"{self.group}.{self.member_id}"
