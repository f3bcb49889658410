"""Key routing: the client puts a keyed message on the same queue as the broker would."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from raftmq.client import key_queue
from raftmq.client._accumulator import RECORD_BYTES, Accumulator, Batch, encode_message, with_queue
from raftmq.cluster.api.app import key_queue as broker_key_queue


@given(st.text(max_size=64), st.integers(1, 1024))
def test_key_routing_matches_the_broker(key: str, queues: int) -> None:
    try:
        key.encode()
    except UnicodeEncodeError:  # lone surrogates: the broker refuses such keys
        return
    assert key_queue(key, queues) == broker_key_queue(key, queues)


def test_key_routing_matches_the_broker_on_known_keys() -> None:
    for key in ["", "a", "customer-7", "ключ", "键", "🙂", "x" * 1000]:
        for queues in (1, 3, 4, 8, 1024):
            assert key_queue(key, queues) == broker_key_queue(key, queues)


def _acc(**kw: int) -> Accumulator:
    settings = {"max_batch_bytes": 1 << 20, "max_batch_messages": 1000, "max_buffer_bytes": 1 << 24, **kw}
    return Accumulator(linger_s=0.005, rand=random.Random(0), **settings)


def _append(acc: Accumulator, value: str, queue: int | None, queues: int = 4, now: float = 0.0) -> int:
    """Append ``value`` as the producer does; the queue it went to."""
    added = acc.try_append("t", queue, queues, value, None, None, len(value), None, now)
    assert added is not None
    return added._batch.queue


def _queue_of(acc: Accumulator, key: str | None, now: float = 0.0) -> int:
    return _append(acc, "v", None if key is None else key_queue(key, 4), now=now)


def test_unkeyed_messages_stick_to_one_queue_for_sticky_bytes_then_move_on() -> None:
    acc = _acc(sticky_bytes=1_000)
    per_stick = -(-1_000 // (len("v") + RECORD_BYTES))  # messages until the stick's bytes are used
    queues = [_queue_of(acc, None) for _ in range(4 * per_stick)]
    sticks = [queues[i : i + per_stick] for i in range(0, len(queues), per_stick)]
    assert all(len(set(stick)) == 1 for stick in sticks)
    assert sorted(stick[0] for stick in sticks) == [0, 1, 2, 3]  # each queue once per round
    acc.ready(1.0)  # sending or sealing batches does not move the stick
    assert _queue_of(acc, None) in range(4)


def _spread(acc: Accumulator, messages: int, slow_queue: int) -> list[int]:
    """Append ``messages`` small unkeyed messages as ``raftmq produce`` does (values "1", "2",
    ...), with a sender that takes ready batches every 64 messages and completes them at once,
    except that ``slow_queue``'s leader answers only every 200th round (its next batch waits and
    grows: with the old rule, stick until the batch is sent, 92-99% of the messages went there).
    Returns the messages per queue."""
    counts = [0, 0, 0, 0]
    slow: list[Batch] = []
    now = 0.0
    for i in range(1, messages + 1):
        counts[_append(acc, str(i), None, now=now)] += 1
        if i % 64 == 0:
            now += 0.001
            taken, _ = acc.ready(now)
            for b in taken:
                if b.queue == slow_queue:
                    slow.append(b)
                else:
                    acc.complete(b)
            if i % (64 * 200) == 0:
                for b in slow:
                    acc.complete(b)
                slow.clear()
    return counts


def test_300000_unkeyed_messages_spread_within_ten_percent_of_even() -> None:
    """Issue 15: no queue above 1/N + 10% (of 1/N) over 300,000 unkeyed messages, also with one
    slow queue (the old sticky-until-the-batch-is-sent rule put most messages on it)."""
    for slow_queue in (0, 3):
        acc = _acc(max_batch_bytes=256 * 1024, max_batch_messages=10_000, max_buffer_bytes=32 << 20)
        counts = _spread(acc, 300_000, slow_queue)
        assert sum(counts) == 300_000
        assert max(counts) <= 300_000 / 4 * 1.10, counts
        assert min(counts) >= 300_000 / 4 * 0.90, counts


def test_unkeyed_spread_follows_a_change_of_the_queue_count() -> None:
    acc = _acc(sticky_bytes=100)
    for _ in range(400):
        _append(acc, "v", None)
    counts = [0] * 8
    for _ in range(8_000):
        counts[_append(acc, "v", None, queues=8)] += 1
    per_stick = -(-100 // (len("v") + RECORD_BYTES))
    assert max(counts) - min(counts) <= per_stick, counts  # the new queues take an even share at once


def test_keyed_messages_go_to_their_key_queue() -> None:
    acc = _acc()
    for key in ("a", "b", "customer-7"):
        assert _queue_of(acc, key) == key_queue(key, 4)


def test_encoded_messages_carry_their_queue_explicitly() -> None:
    encoded, size = encode_message("héllo", "k", {"h": "v"})
    assert with_queue(encoded, 3) == b'{"queue":3,"value":"h\xc3\xa9llo","key":"k","headers":{"h":"v"}}'
    assert size == len("héllo".encode()) + 1 + 2  # value + key + header name and value, as the broker counts
    binary, size = encode_message(b"\x00\x01", None, None)
    assert binary == b'{"value_b64":"AAE="}' and size == 2
