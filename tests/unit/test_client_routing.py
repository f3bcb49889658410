"""Key routing: the client puts a keyed message on the same queue as the broker would."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from raftmq.client import key_queue
from raftmq.client._accumulator import Accumulator, encode_message, with_queue
from raftmq.cluster.http_api import key_queue as broker_key_queue


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


class _Sink:
    def resolve(self, metadata: object) -> None: ...

    def fail(self, error: object) -> None: ...


def _acc(**kw: int) -> Accumulator:
    settings = {"max_batch_bytes": 1 << 20, "max_batch_messages": 1000, "max_buffer_bytes": 1 << 24, **kw}
    return Accumulator(linger_s=0.005, rand=random.Random(0), **settings)


def _queue_of(acc: Accumulator, key: str | None, now: float = 0.0) -> int:
    encoded, _ = encode_message("v", key, None)
    added = acc.try_append("t", None if key is None else key_queue(key, 4), 4, encoded, _Sink(), now)
    assert added is not None
    return added[0]


def test_unkeyed_messages_stick_to_one_queue_until_its_batch_is_sent() -> None:
    acc = _acc()
    first = {_queue_of(acc, None) for _ in range(10)}
    assert len(first) == 1
    taken, _ = acc.ready(1.0)  # linger passed: the batch goes
    assert [b.queue for b in taken] == list(first)
    nxt = _queue_of(acc, None)
    assert nxt == (first.pop() + 1) % 4  # round-robin to the next queue


def test_unkeyed_messages_move_on_when_a_batch_fills() -> None:
    acc = _acc(max_batch_messages=3)
    queues = [_queue_of(acc, None) for _ in range(9)]
    assert len(set(queues[0:3])) == 1 and len(set(queues[3:6])) == 1 and len(set(queues[6:9])) == 1
    assert queues[0] != queues[3] != queues[6]


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
