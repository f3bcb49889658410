"""The SQS check over a history file, streamed as ``streaming_receive`` streams receive/ack: each
operation is paired with its completion as it completes (only those in flight are held), its
records go to buckets by value, and each bucket is judged alone (``sqs_checker.judge``); the merge
is exactly ``sqs_checker.sqs_queue`` of the whole history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .buckets import Buckets
from .history import Op
from .sqs_checker import SQS_SENDS, judge, merge, records
from .streaming_receive import PairingCheck

__all__ = ["SqsCheck"]


class SqsCheck(PairingCheck):
    """Fed every operation of the file in order (:meth:`add`), then :meth:`result`; ``present``
    once the history has an SQS send (the check applies)."""

    def __init__(self, directory: Path, count: int) -> None:
        self.count = count
        self.values = Buckets(directory, "sqs-values", count)
        super().__init__()

    def add(self, op: Op) -> None:
        self._feed(op, SQS_SENDS)

    def _pair(self, invoke: Op, done: Op | None) -> None:
        if invoke["f"].startswith("sqs-"):
            for value, record in records(invoke, done):
                self.values.add(str(value), record)

    def result(self) -> dict[str, Any]:
        for invoke in self._pending.values():  # never completed
            self._pair(invoke, None)
        self._pending.clear()
        self.values.close()
        return merge([judge(self.values.read(i)) for i in range(self.count)])

    @property
    def largest(self) -> int:
        return self.values.largest
