"""The node's clock: the one place the server reads wall-clock time in milliseconds.

State machines never call it: the leader stamps ``now_ms`` into the commands it proposes, and every
replica applies that stamp (docs/architecture.md).
"""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
