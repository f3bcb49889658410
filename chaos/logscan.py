"""What the nodes' logs say after a run: alert lines and tracebacks, counted per node (never judged).

A traceback counts once per log record: a structured (JSON) record carries the whole chained
exception on one line; a plain one (from a library's logger) spans lines, and the second part of a
chained exception ("The above exception was the direct cause ...") is not counted again.
Tracebacks of events that log one by design count apart as ``traceback_expected``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

__all__ = ["EXPECTED_TRACEBACK_EVENTS", "LOG_ALERTS", "scan_logs"]

# Lines in the nodes' logs worth a look after a run (counted per node, never judged).
LOG_ALERTS = {
    "critical": "CRITICAL",
    "diverged_warning": "state machine may have diverged",
    "storage_failure": "storage_failure_stopping",
    "checkpoint_failed": "no replica could send a checkpoint",
}
TRACEBACK = "Traceback (most recent call last)"
# Events that log a traceback by design: a failed apply or journal write (ENOSPC from the disk-full
# nemesis) stops the node with the exception attached. Their tracebacks count apart.
EXPECTED_TRACEBACK_EVENTS = frozenset({"storage_failure_stopping", "journal_storage_failure_stopping"})


def _event(line: str) -> str | None:
    """The ``event`` of a structured record; None for a line that is not one (not JSON, nested too
    deep to parse, not an object, or an event that is not a string)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    event = record.get("event") if isinstance(record, dict) else None
    return event if isinstance(event, str) else None


def _traceback_kind(line: str, previous: str) -> str | None:
    """``traceback`` or ``traceback_expected`` for a line that starts one (a JSON record with an
    ``exception``, or the first line of a plain one, not a chained exception's second part)."""
    if TRACEBACK not in line:
        return None
    if line.startswith("{"):
        return "traceback_expected" if _event(line) in EXPECTED_TRACEBACK_EVENTS else "traceback"
    chained = previous.startswith(("The above exception", "During handling of the above"))
    return None if chained else "traceback"


def scan_logs(logs: Path) -> dict[str, dict[str, int]]:
    """How many log records of each kind of LOG_ALERTS, and how many tracebacks (a record with a
    chained exception counts once), each node's log holds (only the non-zero counts)."""
    found: dict[str, dict[str, int]] = {}
    for path in sorted(logs.glob("*.log")):
        counts: Counter[str] = Counter()
        previous = ""
        for line in path.read_text(errors="replace").splitlines():
            counts.update(name for name, needle in LOG_ALERTS.items() if needle in line)
            kind = _traceback_kind(line, previous)
            if kind:
                counts[kind] += 1
            if line.strip():
                previous = line.strip()
        found[path.stem] = dict(sorted(counts.items()))
    return found
