"""The node's clock: the one place the server reads wall-clock time in milliseconds.

State machines never call it: the leader stamps ``now_ms`` into the commands it proposes, and every
replica applies that stamp, bounded by the group's time (docs/architecture.md, "Time").

``RAFTMQ_TEST_CLOCK_OFFSET_MS`` (a test fault, read once when the process starts; never set it in
production) moves this node's clock by that many ms from the host's: the integration tests' stand-in
for the chaos suite's libfaketime, to run a node whose clock is wrong.
"""

from __future__ import annotations

import os
import time
from typing import Final

__all__ = ["now_ms"]

_OFFSET_MS: Final = int(os.environ.get("RAFTMQ_TEST_CLOCK_OFFSET_MS") or 0)


def now_ms() -> int:
    """Milliseconds since the Unix epoch (plus the test fault's offset, when set)."""
    return time.time_ns() // 1_000_000 + _OFFSET_MS
