"""The SQS checker: the total queue over what boto3 sent and received through the SQS API, and what
became of deleted messages (a pure function of a history; ``streaming_sqs`` streams it).

The SQS workload (``sqs``) records, each an invoke then ``ok``/``fail``/``info``:

- ``sqs-send``: one SendMessageBatch; ``values`` (the bodies, each sent once in the run), and on
  ``ok`` ``results``: one per entry, ``"ok"`` (in ``Successful``) or the entry's error code.
- ``sqs-receive`` / ``sqs-drain-receive``: one ReceiveMessage; on ``ok`` ``messages``:
  ``[[value, message_id, receive_count, receipt], ...]``.
- ``sqs-delete`` / ``sqs-drain-delete``: one DeleteMessageBatch; ``messages``: ``[[value,
  receipt], ...]``, and on ``ok`` ``results`` as a send's.

Judged (``valid``), by the total-queue checker itself (``checkers.total_queue``) over the sends
(an entry acknowledged when its result is ``ok``, failed when its code is definite, unknown
otherwise) and the received bodies: ``lost`` (acknowledged, never received) and ``unexpected``
(received, never sent) must be empty; and ``never_deleted``: after the drain (which ends only when
the queue holds nothing), a received value with no current ``ok`` delete (below) and no delete of
unknown outcome was finished by something else (SQS deletes nothing for an older receipt).

Counted, not judged (at least once allows them): ``duplicated`` values received more than once,
``redelivered`` deliveries with ApproximateReceiveCount above 1, and ``delivered_after_delete``:
a value received by a ReceiveMessage invoked after a *current* delete of it had answered ``ok``. A
delete is current when no other delivery of the value completed between the receive that gave its
receipt and the delete's invoke: SQS answers a delete with an older receipt ``ok`` and deletes
nothing (the message was handed out again meanwhile), so only a current delete promises that the
message is gone. That count is what a delete that did not survive a failover looks like.

Every part depends on one value, so the check of a history is the merge of the checks of any
split of its records by value (``judge``, ``merge``): the in-memory check judges one part.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

from .buckets import first_examples
from .history import FAIL, INFO, INVOKE, OK, Op, completions
from .total_queue import total_queue

__all__ = [
    "SQS_DEFINITE",
    "SQS_DELETES",
    "SQS_RECEIVES",
    "SQS_SENDS",
    "has_sqs",
    "judge",
    "merge",
    "records",
    "sqs_queue",
]

SQS_SENDS = ("sqs-send",)
SQS_RECEIVES = ("sqs-receive", "sqs-drain-receive")
SQS_DELETES = ("sqs-delete", "sqs-drain-delete")
# SQS's error codes after which nothing was done (docs/sqs.md, "Errors"); InternalError and any
# code not here leave the outcome unknown.
SQS_DEFINITE = frozenset({
    "AWS.SimpleQueueService.NonExistentQueue", "ServiceUnavailable", "RequestThrottled",
    "InvalidParameterValue", "InvalidMessageContents", "MissingParameter", "InvalidAddress",
    "ReceiptHandleIsInvalid", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "AWS.SimpleQueueService.BatchRequestTooLong", "AccessDenied", "SignatureDoesNotMatch",
})  # fmt: skip

_COUNTS = (
    "attempt_count", "acknowledged_count", "failed_count", "indefinite_count", "delivery_count",
    "received_count", "lost_count", "unexpected_count", "duplicated_count", "recovered_count",
    "redelivered_count", "deleted_count", "delete_unknown_count", "stale_delete_count",
    "never_deleted_count", "delivered_after_delete_count",
)  # fmt: skip
_EXAMPLES = ("lost", "unexpected", "duplicated", "never_deleted", "delivered_after_delete")


def _entry_type(result: str) -> str:
    return OK if result == "ok" else FAIL if result in SQS_DEFINITE else INFO


def records(invoke: Op, done: Op | None) -> Iterator[tuple[str, list[Any]]]:
    """One operation with its completion (None: never completed), as (value, record) pairs."""
    f = invoke["f"]
    if f in SQS_SENDS:
        values = invoke.get("values") or []
        if done is None or done["type"] != OK:
            kinds = [done["type"] if done is not None else INFO] * len(values)
        else:
            kinds = [_entry_type(r) for r in done.get("results") or []]
            kinds += [INFO] * (len(values) - len(kinds))  # no answer for an entry: unknown
        for value, kind in zip(values, kinds, strict=True):
            yield value, ["s", value, kind]
    elif f in SQS_RECEIVES and done is not None and done["type"] == OK:
        for value, _, count, receipt in done.get("messages") or []:
            yield value, ["r", value, invoke["index"], done["index"], count, receipt]
    elif f in SQS_DELETES:
        msgs = invoke.get("messages") or []
        if done is None or done["type"] != OK:  # a failed call deleted nothing; an unknown one may have
            kinds = [done["type"] if done is not None else INFO] * len(msgs)
        else:
            kinds = [_entry_type(r) for r in done.get("results") or []]
            kinds += [INFO] * (len(msgs) - len(kinds))
        for (value, receipt), kind in zip(msgs, kinds, strict=True):
            if kind != FAIL:
                yield value, ["d", value, receipt, invoke["index"], done["index"] if done else None, kind]


def judge(part: Iterable[list[Any]]) -> dict[str, Any]:
    """The check of some values' records (every record of each value in it)."""
    sends: list[Op] = []
    delivered: list[list[Any]] = []
    by_value: dict[str, list[list[Any]]] = defaultdict(list)
    for r in part:
        if r[0] == "s":
            sends.append({"f": "enqueue", "type": INVOKE, "value": r[1]})
            sends.append({"f": "enqueue", "type": r[2], "value": r[1]})
        else:
            by_value[r[1]].append(r)
            if r[0] == "r":
                delivered.append([0, r[1]])
    tq = total_queue([*sends, {"f": "fetch", "type": OK, "messages": delivered}])
    redelivered = deleted = unknown = stale = 0
    never_deleted: list[str] = []
    after_delete: list[str] = []
    for value, recs in by_value.items():
        receives = sorted((r for r in recs if r[0] == "r"), key=lambda r: r[3])  # by completion
        redelivered += sum(1 for r in receives if (r[4] or 1) > 1)
        gave = {r[5]: r for r in receives}  # receipt -> the receive that handed it out
        deletes = [r for r in recs if r[0] == "d"]
        current_at: int | None = None  # the first current ok delete's completion
        maybe_deleted = False  # a current ok delete, or one whose outcome is unknown
        for d in deletes:
            if d[5] != OK:
                unknown += 1
                maybe_deleted = True
                continue
            source = gave.get(d[2])
            # Current: no other delivery completed between the receipt's and the delete's invoke.
            if source is None or any(source[3] < r[3] < d[3] for r in receives):
                stale += 1
                continue
            deleted += 1
            maybe_deleted = True
            current_at = d[4] if current_at is None else min(current_at, d[4])
        if receives and not maybe_deleted:
            never_deleted.append(value)
        if current_at is not None and any(r[2] > current_at for r in receives):
            after_delete.append(value)
    return {
        "attempt_count": tq["attempt_count"],
        "acknowledged_count": tq["acknowledged_count"],
        "failed_count": tq["failed_count"],
        "indefinite_count": tq["indefinite_count"],
        "delivery_count": tq["dequeue_count"],
        "received_count": tq["distinct_dequeued_count"],
        "lost_count": tq["lost_count"],
        "lost": tq["lost"],
        "unexpected_count": tq["unexpected_count"],
        "unexpected": tq["unexpected"],
        "duplicated_count": tq["duplicated_count"],
        "duplicated": tq["duplicated"],
        "recovered_count": tq["recovered_count"],
        "redelivered_count": redelivered,
        "deleted_count": deleted,
        "delete_unknown_count": unknown,
        "stale_delete_count": stale,
        "never_deleted_count": len(never_deleted),
        "never_deleted": first_examples(never_deleted),
        "delivered_after_delete_count": len(after_delete),
        "delivered_after_delete": first_examples(after_delete),
    }


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The checks of a split of the records by value, as one."""
    merged: dict[str, Any] = {key: sum(p[key] for p in parts) for key in _COUNTS}
    for key in _EXAMPLES:
        merged[key] = first_examples(chain.from_iterable(p[key] for p in parts))
    valid = not (merged["lost_count"] or merged["unexpected_count"] or merged["never_deleted_count"])
    return {"valid": valid, **merged}


def sqs_queue(history: Iterable[Op]) -> dict[str, Any]:
    """The check of a history held in memory."""
    part = [record for invoke, done in completions(history) for _, record in records(invoke, done)]
    return merge([judge(part)])


def has_sqs(history: Iterable[Op]) -> bool:
    return any(op.get("f") in SQS_SENDS and op.get("type") == INVOKE for op in history)
