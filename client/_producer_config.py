"""The producer's settings, checked once when a producer is made."""

from __future__ import annotations

import ssl as _ssl
from dataclasses import dataclass, field
from typing import get_args

from ._accumulator import MAX_REQUESTS_PER_LEADER, Wire
from ._limits import MAX_MESSAGES
from ._transport import AddressMap

__all__ = ["ProducerConfig"]


@dataclass(frozen=True)
class ProducerConfig:
    """The producer's settings (see :class:`AsyncProducer` for their meaning)."""

    linger_ms: int = 0
    max_requests_per_leader: int = MAX_REQUESTS_PER_LEADER
    max_batch_bytes: int = 256 * 1024
    max_batch_messages: int = 10_000
    max_buffer_bytes: int = 32 * 1024 * 1024
    max_block_ms: int = 60_000
    idempotent: bool = True
    producer_id: str | None = None
    delivery_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 2_000
    metadata_max_age_ms: int = 30_000
    address_map: AddressMap | None = None
    token: str | None = field(default=None, repr=False)  # API token (never in a repr)
    ca_file: str | None = None
    ssl: _ssl.SSLContext | None = None
    wire: Wire = "binary"

    def check(self) -> None:
        problems = [
            f"{name} must be positive"
            for name in (
                "max_batch_bytes",
                "max_batch_messages",
                "max_buffer_bytes",
                "max_requests_per_leader",
                "delivery_timeout_ms",
                "request_timeout_ms",
                "metadata_max_age_ms",
            )
            if getattr(self, name) <= 0
        ]
        problems += [
            f"{name} must not be negative"
            for name in ("linger_ms", "max_block_ms", "retry_backoff_ms", "retry_backoff_max_ms")
            if getattr(self, name) < 0
        ]
        if self.max_batch_messages > MAX_MESSAGES:
            problems.append(
                f"max_batch_messages may not exceed the broker's {MAX_MESSAGES:,} messages per request"
            )
        if self.producer_id is not None and not 0 < len(self.producer_id.encode()) <= 200:
            problems.append("producer_id must be 1-200 bytes")
        if self.wire not in get_args(Wire):
            problems.append(f"wire must be 'binary' or 'json', not {self.wire!r}")
        if problems:
            raise ValueError("invalid producer settings: " + "; ".join(problems))
