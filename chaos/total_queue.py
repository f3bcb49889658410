"""The total-queue checker (Jepsen's total-queue): at-least-once over multisets of values, a pure
function of a history. Valid iff nothing acknowledged went missing (``lost``) and nothing was
delivered that nobody sent (``unexpected``). ``checkers`` runs it over the REST workload's enqueues
and deliveries; ``sqs_checker`` over what boto3 sent and received through the SQS API.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from .buckets import first_examples as _sample
from .history import FAIL, INFO, INVOKE, NEMESIS, OK, Op

__all__ = ["DELIVERIES", "total_queue"]

# Operations whose messages count as delivered to a consumer. ``read`` (a replica's local copy) is
# evidence about the log, not a delivery.
DELIVERIES = ("fetch", "drain")


def total_queue(history: Iterable[Op]) -> dict[str, Any]:
    """attempts = enqueue invokes, enqueues = enqueue oks, dequeues = values in ok fetches and
    drains; lost = enqueues - dequeues, unexpected = dequeued but never attempted, duplicated =
    dequeued more than once, recovered = dequeued although its enqueue ended fail or info."""
    ops = (op for op in history if op.get("process") != NEMESIS)
    attempts: Counter[str] = Counter()
    enqueues: Counter[str] = Counter()
    indefinite: set[str] = set()
    failed: set[str] = set()
    dequeues: Counter[str] = Counter()
    idempotent: set[str] = set()  # sent by the client's idempotent producer
    for op in ops:
        if op["f"] == "enqueue":
            if op["type"] == INVOKE:
                attempts[op["value"]] += 1
                if op.get("client") == "producer":
                    idempotent.add(op["value"])
            elif op["type"] == OK:
                enqueues[op["value"]] += 1
            elif op["type"] == INFO:
                indefinite.add(op["value"])
            elif op["type"] == FAIL:
                failed.add(op["value"])
        elif op["f"] in DELIVERIES and op["type"] == OK:
            for _, value in op.get("messages") or []:
                dequeues[str(value)] += 1
    lost = enqueues - dequeues
    unexpected = {v: n for v, n in dequeues.items() if v not in attempts}
    duplicated = {v: n for v, n in dequeues.items() if n > 1}
    recovered = {v for v in dequeues if v not in enqueues and (v in indefinite or v in failed)}
    recovered_failed = {v for v in recovered if v in failed}
    # The idempotent producer's retries carry (producer_id, sequence): the broker should store each
    # of its messages once. Allowed by at-least-once, so counted, not judged.
    duplicated_idempotent = {v for v in duplicated if v in idempotent}
    return {
        "valid": not lost and not unexpected,
        "attempt_count": sum(attempts.values()),
        "acknowledged_count": sum(enqueues.values()),
        "failed_count": len(failed),
        "indefinite_count": len(indefinite),
        "dequeue_count": sum(dequeues.values()),
        "distinct_dequeued_count": len(dequeues),
        "lost_count": sum(lost.values()),
        "lost": _sample(lost),
        "unexpected_count": sum(unexpected.values()),
        "unexpected": _sample(unexpected),
        "duplicated_count": len(duplicated),
        "duplicated": _sample(duplicated),
        "duplicated_idempotent_count": len(duplicated_idempotent),
        "duplicated_idempotent": _sample(duplicated_idempotent),
        "recovered_count": len(recovered),
        "recovered": _sample(recovered),
        # A definite failure that was delivered all the same breaks the API's promise that a
        # `definite: true` error changed nothing; counted apart so it stands out.
        "recovered_after_definite_fail_count": len(recovered_failed),
        "recovered_after_definite_fail": _sample(recovered_failed),
    }
