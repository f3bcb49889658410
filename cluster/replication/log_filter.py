"""pysyncobj's log lines that would only alarm operators, filtered (the logger is pysyncobj's; the
module needs no pysyncobj import)."""

from __future__ import annotations

import logging

__all__ = ["MatchingTruncationFilter", "install_log_filter"]


class MatchingTruncationFilter(logging.Filter):
    """Drops pysyncobj's CRITICAL "truncating already-applied log entries" line.

    pysyncobj logs it whenever a follower truncates from below its applied index (hazard 5). With
    DurableJournal that truncation keeps every entry that matches the leader (a current-term suffix
    is kept; committed entries always match the leader's), so nothing applied is lost or replayed
    differently; the line would only alarm operators. tests/unit/test_journal.py covers the cases.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("truncating already-applied log entries")


def install_log_filter() -> None:
    logger = logging.getLogger("pysyncobj.syncobj")
    if not any(isinstance(f, MatchingTruncationFilter) for f in logger.filters):
        logger.addFilter(MatchingTruncationFilter())
