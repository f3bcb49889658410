"""The receive/ack checker: at-least-once delivery to one consumer group (a pure function of a history).

Over the values of the run (each produced once, see ``workload``):

- ``acknowledged``: enqueues that ended ``ok``; ``attempts``: every enqueue invoked.
- ``received``: values in ``ok`` receives (``receive`` and ``drain-receive``), with how many times
  (``deliveries``) and at which attempt numbers.
- ``acked``: values with a receipt whose ack answered ``ok``; ``ack_unknown``: values whose only
  acks ended ``info``, or answered an indefinite code for their receipt (``unknown_outcome``,
  ``timeout``, ...): the ack may have happened.

Valid iff, after the drain:

- ``lost`` is empty: every acknowledged value was received at least once;
- ``unexpected`` is empty: nothing was received that nobody produced;
- ``never_acked`` is empty: every received value has an ``ok`` or unknown ack. The drain ends only
  when the group's committed offset covers every queue, so a received value nobody acked was
  finished by something else (a bug: acked under another receipt, expired, dropped);
- ``divergent`` is empty: one (queue, offset) was handed out with one value only.

Counted, not judged: ``duplicated`` (values delivered more than once), ``redelivered`` (deliveries
with ``attempt`` > 1), ``stale_acks`` (receipts refused because the message was redelivered
meanwhile), and ``delivered_after_ack`` (a value received again by a receive invoked after an ack of
it had answered ``ok``: legal for at-least-once, but it should not happen).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from raftmq.client.errors import BY_CODE

from .history import FAIL, INFO, INVOKE, OK, Op, completions

__all__ = ["RECEIVES", "has_receives", "receive_ack"]

RECEIVES = ("receive", "drain-receive")
ACKS = ("ack", "drain-ack")
# Per-receipt answers after which the ack may or may not have happened (indefinite codes), and
# "missing": the answer had no result for the receipt.
MAYBE_DONE = frozenset({code for code, cls in BY_CODE.items() if not cls.definite} | {"missing"})
SAMPLE = 20


def _sample(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=str)[:SAMPLE]


def receive_ack(history: Iterable[Op]) -> dict[str, Any]:
    attempts: set[str] = set()
    acknowledged: set[str] = set()
    produced_unsure: set[str] = set()
    deliveries: Counter[str] = Counter()
    redelivered = 0
    positions: dict[tuple[int, int], set[str]] = defaultdict(set)
    acked: dict[str, int] = {}  # value -> index of the first ok ack's completion
    ack_unknown: set[str] = set()
    stale_acks = 0
    received_at: dict[str, list[int]] = defaultdict(list)  # value -> invoke indexes of its receives
    for invoke, done in completions(history):
        f = invoke["f"]
        if f == "enqueue":
            attempts.add(invoke["value"])
            if done is not None and done["type"] == OK:
                acknowledged.add(invoke["value"])
            elif done is None or done["type"] in (INFO, FAIL):
                produced_unsure.add(invoke["value"])
        elif f in RECEIVES and done is not None and done["type"] == OK:
            for queue, offset, value, attempt in done.get("messages") or []:
                deliveries[value] += 1
                redelivered += 1 if (attempt or 1) > 1 else 0
                positions[(int(queue), int(offset))].add(value)
                received_at[value].append(invoke["index"])
        elif f in ACKS:
            msgs = invoke.get("messages") or []
            if done is None or done["type"] == INFO:
                ack_unknown.update(m[2] for m in msgs)
            elif done["type"] == OK:
                for m, result in zip(msgs, done.get("results") or [], strict=False):
                    if result == "ok":
                        acked.setdefault(m[2], done["index"])
                    elif result == "stale_receipt":
                        stale_acks += 1
                    elif result in MAYBE_DONE:  # e.g. its group's leader died with the ack in flight
                        ack_unknown.add(m[2])
    received = set(deliveries)
    lost = acknowledged - received
    unexpected = {v: n for v, n in deliveries.items() if v not in attempts}
    never_acked = received - set(acked) - ack_unknown
    divergent = {f"{q}@{o}": sorted(vs) for (q, o), vs in sorted(positions.items()) if len(vs) > 1}
    duplicated = {v: n for v, n in deliveries.items() if n > 1}
    after_ack = {v for v, at in acked.items() if any(i > at for i in received_at[v])}
    return {
        "valid": not lost and not unexpected and not never_acked and not divergent,
        "attempt_count": len(attempts),
        "acknowledged_count": len(acknowledged),
        "received_count": len(received),
        "delivery_count": sum(deliveries.values()),
        "acked_count": len(acked),
        "ack_unknown_count": len(ack_unknown - set(acked)),
        "lost_count": len(lost),
        "lost": _sample(lost),
        "unexpected_count": sum(unexpected.values()),
        "unexpected": _sample(unexpected),
        "never_acked_count": len(never_acked),
        "never_acked": _sample(never_acked),
        "divergent_count": len(divergent),
        "divergent": dict(list(divergent.items())[:SAMPLE]),
        "duplicated_count": len(duplicated),
        "duplicated": _sample(duplicated),
        "redelivered_count": redelivered,
        "stale_ack_count": stale_acks,
        "delivered_after_ack_count": len(after_ack),
        "delivered_after_ack": _sample(after_ack),
        # Received although the enqueue ended fail/info (or never ended): allowed, counted.
        "recovered_count": len(received & produced_unsure - acknowledged),
    }


def has_receives(history: Iterable[Op]) -> bool:
    return any(op.get("f") in RECEIVES and op.get("type") == INVOKE for op in history)
