"""What a produced batch may hold: :class:`Limits` (``_validate.validate`` checks a batch
against them; ``_small.py`` too, on its path)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True, slots=True)
class Limits:
    """What a produced batch may hold (the node fills it from its ``[limits]``).

    ``max_message_bytes`` counts, per message, the key, every header name and value, and the
    value, as the JSON API does. ``refuse_reserved_headers``: a header whose name starts with
    ``raftmq-`` (any ASCII case) is the broker's own and refused (reason ``reserved_header``).
    """

    max_message_bytes: int = 1024 * 1024
    max_batch_bytes: int = 4 * 1024 * 1024
    max_records: int = 10_000
    max_key_bytes: int = 64 * 1024
    max_headers: int = 64
    max_delay_ms: int = 7 * 24 * 3600 * 1000
    max_ttl_ms: int = 10 * 365 * 24 * 3600 * 1000
    refuse_reserved_headers: bool = True
