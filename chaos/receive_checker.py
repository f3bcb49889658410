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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftmq.client.errors import BY_CODE

from .history import INFO, INVOKE, OK, Op, completions

__all__ = ["COUNTS", "RECEIVES", "Record", "Values", "has_receives", "pair", "receive_ack"]

RECEIVES = ("receive", "drain-receive")
ACKS = ("ack", "drain-ack")
# Per-receipt answers after which the ack may or may not have happened (indefinite codes), and
# "missing": the answer had no result for the receipt.
MAYBE_DONE = frozenset({code for code, cls in BY_CODE.items() if not cls.definite} | {"missing"})
SAMPLE = 20
COUNTS = (
    "attempt_count", "acknowledged_count", "received_count", "delivery_count", "acked_count",
    "ack_unknown_count", "lost_count", "unexpected_count", "never_acked_count", "duplicated_count",
    "delivered_after_ack_count", "recovered_count",
)  # fmt: skip
"""The counts of :meth:`Values.verdicts`, which add over value buckets."""


def _sample(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=str)[:SAMPLE]


Record = Sequence[Any]
"""What one completed operation says of the values, as :func:`pair` gives it: ``("e", value, ok)``
an enqueue; ``("r", value, invoke index, queue, offset, attempt)`` a delivery; ``("k", value,
invoke index, completion index)`` an ``ok`` ack; ``("u", value)`` an ack that may have happened;
``("s",)`` a stale receipt's ack."""


def pair(invoke: Op, done: Op | None) -> Iterator[Record]:
    """The records of one operation and its completion (None: it never completed)."""
    f = invoke["f"]
    if f == "enqueue":
        yield ("e", invoke["value"], done is not None and done["type"] == OK)
    elif f in RECEIVES and done is not None and done["type"] == OK:
        for queue, offset, value, attempt in done.get("messages") or []:
            yield ("r", value, invoke["index"], int(queue), int(offset), attempt or 1)
    elif f in ACKS:
        msgs = invoke.get("messages") or []
        if done is None or done["type"] == INFO:
            yield from (("u", m[2]) for m in msgs)
        elif done["type"] == OK:
            for m, result in zip(msgs, done.get("results") or [], strict=False):
                if result == "ok":
                    yield ("k", m[2], invoke["index"], done["index"])
                elif result == "stale_receipt":
                    yield ("s",)
                elif result in MAYBE_DONE:  # e.g. its group's leader died with the ack in flight
                    yield ("u", m[2])


@dataclass
class Values:
    """What the records say of each value (all of them, or one bucket's)."""

    attempts: set[Any] = field(default_factory=set)
    acknowledged: set[Any] = field(default_factory=set)
    unsure: set[Any] = field(default_factory=set)  # enqueues that ended fail or info, or never did
    deliveries: Counter[Any] = field(default_factory=Counter)
    received_at: dict[Any, list[int]] = field(default_factory=lambda: defaultdict(list))  # invoke indexes
    first_ack: dict[Any, tuple[int, int]] = field(default_factory=dict)  # (invoke, completion) index
    ack_unknown: set[Any] = field(default_factory=set)

    def add(self, r: Record) -> None:
        """One ``e``, ``r``, ``k`` or ``u`` record: an ``ok`` ack counts from the first in invoke order."""
        kind, value = r[0], r[1]
        if kind == "e":
            self.attempts.add(value)
            (self.acknowledged if r[2] else self.unsure).add(value)
        elif kind == "r":
            self.deliveries[value] += 1
            self.received_at[value].append(r[2])
        elif kind == "k":
            if value not in self.first_ack or r[2] < self.first_ack[value][0]:
                self.first_ack[value] = (r[2], r[3])
        else:
            self.ack_unknown.add(value)

    def verdicts(self) -> dict[str, Any]:
        """Counts of the values, and the values of each fault (``lost``, ``unexpected``: value ->
        deliveries, ``never_acked``, ``duplicated``: value -> deliveries, ``delivered_after_ack``)."""
        acked = {v: at for v, (_, at) in self.first_ack.items()}
        received = set(self.deliveries)
        lost = self.acknowledged - received
        unexpected = {v: n for v, n in self.deliveries.items() if v not in self.attempts}
        never_acked = received - set(acked) - self.ack_unknown
        duplicated = {v: n for v, n in self.deliveries.items() if n > 1}
        after_ack = {v for v, at in acked.items() if any(i > at for i in self.received_at[v])}
        return {
            "attempt_count": len(self.attempts),
            "acknowledged_count": len(self.acknowledged),
            "received_count": len(received),
            "delivery_count": sum(self.deliveries.values()),
            "acked_count": len(acked),
            "ack_unknown_count": len(self.ack_unknown - set(acked)),
            "lost_count": len(lost),
            "lost": lost,
            "unexpected_count": sum(unexpected.values()),
            "unexpected": unexpected,
            "never_acked_count": len(never_acked),
            "never_acked": never_acked,
            "duplicated_count": len(duplicated),
            "duplicated": duplicated,
            "delivered_after_ack_count": len(after_ack),
            "delivered_after_ack": after_ack,
            # Received although the enqueue ended fail/info (or never ended): allowed, counted.
            "recovered_count": len(received & self.unsure - self.acknowledged),
        }


def receive_ack(history: Iterable[Op]) -> dict[str, Any]:
    values = Values()
    redelivered = stale_acks = 0
    positions: dict[tuple[int, int], set[str]] = defaultdict(set)
    for invoke, done in completions(history):
        for r in pair(invoke, done):
            if r[0] == "s":
                stale_acks += 1
                continue
            values.add(r)
            if r[0] == "r":
                redelivered += 1 if r[5] > 1 else 0
                positions[(r[3], r[4])].add(r[1])
    v = values.verdicts()
    divergent = {f"{q}@{o}": sorted(vs) for (q, o), vs in sorted(positions.items()) if len(vs) > 1}
    return {
        "valid": not v["lost"] and not v["unexpected"] and not v["never_acked"] and not divergent,
        **{k: v[k] for k in COUNTS[:6]},
        "lost_count": v["lost_count"],
        "lost": _sample(v["lost"]),
        "unexpected_count": v["unexpected_count"],
        "unexpected": _sample(v["unexpected"]),
        "never_acked_count": v["never_acked_count"],
        "never_acked": _sample(v["never_acked"]),
        "divergent_count": len(divergent),
        "divergent": dict(list(divergent.items())[:SAMPLE]),
        "duplicated_count": v["duplicated_count"],
        "duplicated": _sample(v["duplicated"]),
        "redelivered_count": redelivered,
        "stale_ack_count": stale_acks,
        "delivered_after_ack_count": v["delivered_after_ack_count"],
        "delivered_after_ack": _sample(v["delivered_after_ack"]),
        "recovered_count": v["recovered_count"],
    }


def has_receives(history: Iterable[Op]) -> bool:
    return any(op.get("f") in RECEIVES and op.get("type") == INVOKE for op in history)
