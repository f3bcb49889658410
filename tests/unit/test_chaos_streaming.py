"""The streamed checkers (``chaos/streaming.py``) against the in-memory ones: on histories with known
faults (lost, duplicated, unexpected, divergent, skipped, committed offsets going back) the streamed
check, over many buckets or one, gives exactly the in-memory verdict and evidence; and its memory
is bounded by a bucket, not by the history's length."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest

from raftmq.chaos import buckets
from raftmq.chaos.checkers import check_all, total_queue
from raftmq.chaos.group_checker import group_consume
from raftmq.chaos.history import Op, load_history
from raftmq.chaos.report import latency_points
from raftmq.chaos.streaming import check_file, stream_group_consume, stream_total_queue


class Run:
    """A random history the way a run writes one: workload producers (one op at a time, some
    failing or unknown), the load (a process per message), offset consumers and the drain, group
    consumers with committed reads, and nemesis windows; with faults put in on purpose."""

    def __init__(self, seed: int, messages: int, queues: int = 4) -> None:
        self.rng = random.Random(seed)
        self.ops: list[Op] = []
        self.logs: list[list[str]] = [[] for _ in range(queues)]
        self.process = 0
        self.committed = [0] * queues
        self.messages = messages

    def op(self, **fields: Any) -> None:
        self.ops.append({"index": len(self.ops), "time": len(self.ops) * 1000, **fields})

    def new_process(self) -> int:
        self.process += 1
        return self.process

    def produce(self, n: int) -> None:
        rng = self.rng
        load = n % 3 != 0
        value = f"L{n % 4}-{n}" if load else f"{n % 5}-{n}"
        client = "load" if load else rng.choice(["attempt", "producer"])
        p = self.new_process()
        queue = rng.randrange(len(self.logs))
        self.op(
            type="invoke", process=p, f="enqueue", value=value, client=client, queue=None if load else queue
        )
        outcome = rng.choices(["ok", "fail", "info", "stored-unknown"], [90, 4, 3, 3])[0]
        if outcome in ("ok", "stored-unknown"):
            self.logs[queue].append(value)
        if outcome == "ok":
            self.op(type="ok", process=p, f="enqueue", value=value, client=client, queue=queue,
                    offset=len(self.logs[queue]) - 1)  # fmt: skip
        elif outcome != "stored-unknown" or rng.random() < 0.5:  # some unknown ones never complete
            kind = "fail" if outcome == "fail" else "info"
            self.op(
                type=kind, process=p, f="enqueue", value=value, client=client, queue=None, error="timeout"
            )

    def read(self, f: str, queue: int, start: int, end: int, node: str = "n1") -> None:
        """Reads of 100 messages at most, as the workload's (the drain's: 1,000)."""
        for first in range(start, max(end, start + 1), 100):
            p = self.new_process()
            self.op(type="invoke", process=p, f=f, node=node, queue=queue, offset=first)
            messages: list[list[Any]] = [
                [o, self.logs[queue][o]] for o in range(first, min(first + 100, end))
            ]
            self.op(type="ok", process=p, f=f, node=node, queue=queue, offset=first, messages=messages)

    def consume(self, queue: int, start: int, end: int) -> None:
        for first in range(start, end, 100):
            p = self.new_process()
            messages = [[queue, o, self.logs[queue][o]] for o in range(first, min(first + 100, end))]
            self.op(type="invoke", process=p, f="consume", client="group", member="load-0")
            self.op(type="ok", process=p, f="consume", client="group", member="load-0", messages=messages)

    def read_committed(self, final: bool = False) -> None:
        p = self.new_process()
        offsets = {str(q): o for q, o in enumerate(self.committed)}
        self.op(type="invoke", process=p, f="committed", client="group")
        self.op(
            type="ok",
            process=p,
            f="committed",
            client="group",
            offsets=offsets,
            **({"final": True} if final else {}),
        )

    def receive(self, queue: int, start: int, end: int) -> None:
        """A receive of [start, end) of a queue, then its ack, with what goes wrong in a run: an
        answer lost, an ack whose outcome is unknown, a stale or indefinite or missing result,
        a message received again (after its ack, or as a redelivery), one acked never."""
        rng = self.rng
        p = self.new_process()
        common = {"process": p, "f": "receive", "node": "n2", "group": "chaos-rx"}
        self.op(type="invoke", **common)
        if rng.random() < 0.05:
            self.op(type="info", error="timeout", **common)
            return
        attempt = 2 if rng.random() < 0.1 else 1
        messages = [[queue, o, self.logs[queue][o], attempt] for o in range(start, end)]
        self.op(type="ok", messages=messages, **common)
        if rng.random() < 0.03:
            return  # never acked
        receipts = [[q, o, v, f"t.{q}.{o}.{p}"] for q, o, v, _ in messages]
        a = self.new_process()
        common = {"process": a, "f": "ack", "node": "n2", "group": "chaos-rx", "messages": receipts}
        self.op(type="invoke", **common)
        if rng.random() < 0.05:
            self.op(type="info", error="connection_lost", **common)
            return
        results = [
            rng.choices(["ok", "stale_receipt", "timeout", "not_found"], [90, 4, 3, 3])[0] for _ in receipts
        ]
        self.op(type="ok", results=results[: len(results) - (rng.random() < 0.05)], **common)

    def build(self, receivers: bool = False) -> list[Op]:
        rng = self.rng
        read_to = [0] * len(self.logs)
        consumed_to = [0] * len(self.logs)
        received_to = [0] * len(self.logs)
        for n in range(self.messages):
            if n % 97 == 0:
                self.op(
                    type="info",
                    process="nemesis",
                    f="start" if n % 2 else "stop",
                    fault="kill",
                    fault_id=n // 194,
                )
            self.produce(n)
            if rng.random() < 0.2:
                q = rng.randrange(len(self.logs))
                end = rng.randint(read_to[q], len(self.logs[q]))
                self.read("fetch", q, read_to[q], end)
                read_to[q] = end
            if rng.random() < 0.2:
                q = rng.randrange(len(self.logs))
                end = rng.randint(consumed_to[q], len(self.logs[q]))
                self.consume(q, consumed_to[q], end)
                consumed_to[q] = end
                self.committed[q] = end
            if rng.random() < 0.02:
                self.read_committed()
            if receivers and rng.random() < 0.2:
                q = rng.randrange(len(self.logs))
                end = min(rng.randint(received_to[q], len(self.logs[q])), received_to[q] + 20)
                self.receive(q, max(0, received_to[q] - (rng.random() < 0.1)), end)  # sometimes one again
                received_to[q] = end
        for q, log in enumerate(self.logs):
            self.read("drain", q, read_to[q], len(log))
            for node in ("n1", "n2", "n3"):
                self.read("read", q, 0, len(log), node=node)
        self.read_committed(final=True)
        return self.ops


def faulty(seed: int, messages: int) -> list[Op]:
    """A run with 30 of each fault, more than a verdict's examples (20), so that the streamed check
    must pick the same first examples across buckets."""
    run = Run(seed, messages)
    ops = run.build()
    rng = random.Random(seed + 1)
    delivered = [op for op in ops if op["f"] in ("fetch", "drain") and op["type"] == "ok" and op["messages"]]
    consumed = [op for op in ops if op["f"] == "consume" and op["type"] == "ok" and op["messages"]]
    for _ in range(30):
        rng.choice([op for op in delivered if len(op["messages"]) > 1])[
            "messages"
        ].pop()  # lost (unless read again)
        rng.choice([op for op in consumed if len(op["messages"]) > 1])["messages"].pop(
            0
        )  # skipped (the same)
    for _ in range(30):
        rng.choice(delivered)["messages"].append([10**6, f"stranger-{rng.randrange(10**6)}"])  # unexpected
        op = rng.choice(delivered)
        op["messages"].append(list(op["messages"][0]))  # duplicated
        op = rng.choice(consumed)
        op["messages"][0][2] = f"other-{rng.randrange(10**6)}"  # divergent (and unexpected)
    replica_reads = [op for op in ops if op["f"] == "read" and op.get("messages")]
    for op in rng.sample(replica_reads, 25):
        op["messages"][-1][1] = f"diverged-{rng.randrange(10**6)}"  # a replica holds another value
    acks = [op for op in ops if op["f"] == "enqueue" and op["type"] == "ok" and op["client"] != "load"]
    for a, b in rng.sample(list(pairwise(acks)), 25):
        a["offset"], b["offset"] = b["offset"], a["offset"]  # acknowledged at each other's offsets
    for n in range(25):  # acknowledged, never stored: lost below offsets others read
        q, p = rng.randrange(len(run.logs)), 10**7 + n
        at = rng.randrange(len(ops))
        common = {"process": p, "f": "enqueue", "value": f"ghost-{n}", "client": "attempt", "queue": q}
        ops[at:at] = [
            {"type": "invoke", **common},
            {"type": "ok", **common, "offset": rng.randrange(len(run.logs[q]) // 2)},
        ]
    for index, op in enumerate(ops):
        op["index"], op["time"] = index, index * 1000
    committed = [op for op in ops if op["f"] == "committed" and op["type"] == "ok" and not op.get("final")]
    for op in rng.sample(committed, min(5, len(committed))):
        op["offsets"]["0"] = 0 if op["offsets"]["0"] else None  # went back (or vanished)
    return ops


def faulty_receives(seed: int, messages: int) -> list[Op]:
    """A run with receivers and 25 of each fault of theirs: a receive of a value nobody sent, one
    position handed out with two values, an acknowledged message never received."""
    run = Run(seed, messages)
    ops = run.build(receivers=True)
    rng = random.Random(seed + 2)
    receives = [op for op in ops if op["f"] == "receive" and op["type"] == "ok" and op["messages"]]
    for n in range(25):
        rng.choice(receives)["messages"].append([0, 10**6 + n, f"stranger-{n}", 1])  # unexpected
        op = rng.choice(receives)
        q, o, _, attempt = op["messages"][0]
        op["messages"].append([q, o, f"other-{n}", attempt])  # divergent (and unexpected)
        op = rng.choice(receives)
        if len(op["messages"]) > 1:
            op["messages"].pop()  # lost, never acked: unless received again
    return ops


def write(tmp_path: Path, ops: list[Op], name: str = "history.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE) for op in ops))
    return path


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("bucket_bytes", [4_096, 1 << 30])  # many buckets, and one
def test_the_streamed_checks_find_what_the_in_memory_ones_find(
    tmp_path: Path, seed: int, bucket_bytes: int
) -> None:
    ops = faulty(seed, 3_000)
    path = write(tmp_path, ops)
    expected_queue, expected_group = total_queue(ops), group_consume(ops)
    assert not expected_queue["valid"] and expected_queue["lost_count"] > 0  # the faults are there
    assert expected_queue["unexpected_count"] >= 30 and expected_queue["duplicated_count"] >= 20
    assert not expected_group["valid"] and expected_group["divergent_count"] >= 20
    assert expected_group["skipped_count"] > 0 and expected_group["backwards_count"] > 0
    assert stream_total_queue(path, bucket_bytes=bucket_bytes) == expected_queue
    assert stream_group_consume(path, bucket_bytes=bucket_bytes) == expected_group


@pytest.mark.parametrize("seed", [4, 5])
def test_a_clean_run_passes_streamed_as_in_memory(tmp_path: Path, seed: int) -> None:
    ops = Run(seed, 2_000).build()
    path = write(tmp_path, ops)
    streamed, figures = check_file(path, bucket_bytes=8_192)
    assert streamed == check_all(load_history(path))
    assert streamed["valid"] and streamed["group_consume"]["valid"]
    assert figures["buckets"] == -(-path.stat().st_size // 8_192)
    assert not list(tmp_path.glob("check-*"))  # the buckets are removed


@pytest.mark.parametrize("seed", [6, 7])
def test_every_checker_of_a_file_agrees_with_check_all_on_a_faulty_run(tmp_path: Path, seed: int) -> None:
    ops = faulty(seed, 3_000)
    path = write(tmp_path, ops)
    expected = check_all(load_history(path))
    for check, more_than_a_sample in (
        ("log_consistency", ("divergent_count", "duplicate_offsets_count")),
        ("queue_order", ("problem_count",)),
        ("lost_write", ("lost_count",)),
    ):
        assert not expected[check]["valid"]
        assert all(expected[check][key] > 20 for key in more_than_a_sample), (check, expected[check])
    for bucket_bytes in (4_096, 1 << 30):
        streamed, _ = check_file(path, bucket_bytes=bucket_bytes)
        assert streamed == expected


@pytest.mark.parametrize("seed", [8, 9])
def test_the_streamed_receive_check_finds_what_the_in_memory_one_finds(tmp_path: Path, seed: int) -> None:
    path = write(tmp_path, faulty_receives(seed, 3_000))
    expected = check_all(load_history(path))
    rx = expected["receive_ack"]
    assert not rx["valid"]
    for key in ("lost_count", "unexpected_count", "never_acked_count", "divergent_count", "duplicated_count",
                "delivered_after_ack_count", "ack_unknown_count"):  # fmt: skip
        assert rx[key] > 20, (key, rx)
    assert rx["stale_ack_count"] > 0 and rx["redelivered_count"] > 0 and rx["recovered_count"] > 0
    for bucket_bytes in (4_096, 1 << 30):
        assert check_file(path, bucket_bytes=bucket_bytes)[0] == expected


def test_the_hand_built_receive_faults_stream_to_the_same_verdicts(tmp_path: Path) -> None:
    from tests.unit import test_chaos_receive_checker as rx_tests

    tests = [
        getattr(rx_tests, name)
        for name in dir(rx_tests)
        if name.startswith("test_") and "traceback" not in name
    ]
    histories: list[list[Op]] = []
    original = rx_tests.receive_ack

    def recording(history: list[Op]) -> dict[str, Any]:
        histories.append(list(history))
        return original(history)

    rx_tests.receive_ack = recording  # type: ignore[assignment]
    try:
        for test in tests:
            test()
    finally:
        rx_tests.receive_ack = original
    assert len(histories) >= 10
    for n, ops in enumerate(histories):
        path = write(tmp_path, ops, f"rx{n}.jsonl")
        expected = check_all(ops)
        assert "receive_ack" in expected
        for bucket_bytes in (64, 1 << 20):
            assert check_file(path, bucket_bytes=bucket_bytes)[0] == expected, n


def test_every_checker_of_a_file_agrees_with_check_all_on_the_hand_built_faults(tmp_path: Path) -> None:
    from tests.unit.test_chaos_checkers import Builder, clean

    histories = []
    h = clean()
    h.read(10, 0, 0, [(0, "1-0"), (1, "1-1")], f="read", node="n3")  # two values at one offset
    h.enqueue(4, "4-0", 1, offset=1)  # an acknowledgement overwritten
    histories.append(h)
    h = Builder()
    h.enqueue(1, "1-0", 0, offset=1)
    h.enqueue(1, "1-1", 0, offset=0)  # reordered
    h.read(9, 0, 0, [(0, "1-1"), (1, "1-0")])
    h.read(9, 0, 3, [(3, "c"), (5, "d")])  # holes at 2 and 4, a gap in the answer
    histories.append(h)
    h = Builder()
    for n in range(3):
        h.enqueue(1, f"1-{n}", 0, offset=n)
    h.read(9, 0, 2, [(2, "1-2")])  # 1-1 below a read offset, read by no one: a lost write
    h.read(9, 0, 0, [(0, "1-0")])
    h.nemesis("start", "kill", 1)
    h.enqueue(1, "1-3", 0, outcome="fail", error="unavailable")
    h.nemesis("stop", "kill", 1)
    histories.append(h)
    for n, built in enumerate(histories):
        path = write(tmp_path, built.ops, f"h{n}.jsonl")
        expected = check_all(built.ops)
        assert not expected["valid"]
        for bucket_bytes in (64, 1 << 20):
            assert check_file(path, bucket_bytes=bucket_bytes)[0] == expected, n


def test_the_hand_built_faults_of_the_checker_tests_stream_to_the_same_verdicts(tmp_path: Path) -> None:
    from tests.unit import test_chaos_checkers as tq_tests
    from tests.unit import test_chaos_group_checker as group_tests

    histories: list[list[Op]] = [tq_tests.clean().ops, group_tests.clean().ops]
    h = tq_tests.clean()
    h.enqueue(2, "2-1", 0, offset=3)  # lost
    h.read(9, 1, 2, [(2, "never-sent")], f="drain")  # unexpected
    h.read(9, 0, 3, [(3, "1-0")], f="drain")  # duplicated
    h.enqueue(4, "4-0", 1, outcome="fail", error="unavailable")
    h.read(9, 1, 2, [(2, "4-0")], f="drain")  # delivered after a definite fail
    histories.append(h.ops)
    for change in (
        lambda b: b.committed({"0": 4, "1": 1}, final=True),  # skipped
        lambda b: b.committed({"0": 2, "1": 1}, final=True),  # backwards
        lambda b: b.committed({"0": None, "1": None}, final=True),  # vanished
        lambda b: b.consume((0, 3, "v9")),  # divergent
    ):
        b = group_tests.clean()
        change(b)
        histories.append(b.ops)
    for n, ops in enumerate(histories):
        path = write(tmp_path, ops, f"h{n}.jsonl")
        for bucket_bytes in (64, 1 << 20):
            assert stream_total_queue(path, bucket_bytes=bucket_bytes) == total_queue(ops), n
            assert stream_group_consume(path, bucket_bytes=bucket_bytes) == group_consume(ops), n


def _peak_bytes(check: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        check()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_streamed_checks_memory_does_not_grow_with_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket_bytes = 128 << 10
    monkeypatch.setattr(buckets, "HELD_BYTES", 32 << 10)  # the records written out at most so late
    short = write(tmp_path, Run(7, 1_500).build(), "short.jsonl")
    long = write(tmp_path, Run(7, 6_000).build(), "long.jsonl")
    assert long.stat().st_size > 3.5 * short.stat().st_size

    def streamed(path: Path) -> int:
        return _peak_bytes(lambda: check_file(path, bucket_bytes=bucket_bytes))

    def in_memory(path: Path) -> int:
        return _peak_bytes(lambda: check_all(load_history(path)))

    # Four times the history: the in-memory checks hold about four times as much, the streamed ones
    # one bucket's worth either way (and a bit per offset of each queue).
    assert in_memory(long) > 3 * in_memory(short)
    assert streamed(long) < 1.3 * streamed(short)
    assert streamed(long) < in_memory(long) / 10


def test_the_latency_plot_keeps_an_even_sample_of_a_long_series() -> None:
    ops: list[Op] = []
    for n in range(5_000):
        common = {"process": n, "f": "enqueue", "value": f"0-{n}"}
        ops += [{"time": n * 10, "type": "invoke", **common}, {"time": n * 10 + 3, "type": "ok", **common}]
    ops += [{"time": 60_000, "type": "invoke", "process": -1, "f": "fetch"},
            {"time": 60_001, "type": "fail", "process": -1, "f": "fetch"}]  # fmt: skip
    points = latency_points(ops, max_points=500)
    xs, ys = points[("enqueue", "ok")]
    assert len(xs) == len(ys) == 500  # at most max_points of a series
    assert points[("fetch", "fail")] == ([60_000 / 1e9], [0.01])  # a short series keeps every point
    halves = sum(x < 25_000 / 1e9 for x in xs)
    assert 200 < halves < 300  # spread over the whole run, not its first 500
