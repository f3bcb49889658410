"""tests/bench/bench_sqs_floor.py's fixed answers are ones boto3's users would take from SQS (each
entry's Id, the MD5 of the body the cycle sends), and split_sqs_stages.py puts a sample in the stage
docs/benchmarks.md says: aiohttp under the listener's wrapper is the floor's, a tick thread's
sample its applies, journal or transport, a store read under a receive's answer the store's."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from types import ModuleType

import orjson
import pytest
from bench_scripts import loaded_bench


@pytest.fixture(scope="module")
def floor() -> Iterator[ModuleType]:
    yield from loaded_bench("bench_sqs_floor")


@pytest.fixture(scope="module")
def stages() -> Iterator[ModuleType]:
    yield from loaded_bench("split_sqs_stages")


def test_fixed_answers_carry_the_ids_and_md5s_of_the_cycle(floor: ModuleType) -> None:
    answers = {k: orjson.loads(v) for k, v in floor.fixed_answers(100).items()}
    md5 = hashlib.md5(b"x" * 100).hexdigest()
    sent = answers["SendMessageBatch"]["Successful"]
    assert [e["Id"] for e in sent] == [str(i) for i in range(10)]
    assert {e["MD5OfMessageBody"] for e in sent} == {md5}
    got = answers["ReceiveMessage"]["Messages"]
    assert len({m["ReceiptHandle"] for m in got}) == 10
    assert all(m["Body"] == "x" * 100 and m["MD5OfBody"] == md5 for m in got)
    assert [e["Id"] for e in answers["DeleteMessageBatch"]["Successful"]] == [str(i) for i in range(10)]


LOOP = "BaseEventLoop.run_forever (asyncio/base_events.py:607);Handle._run (asyncio/events.py:80)"
TICK = "Thread.run (threading.py:975);SyncObj._autoTickThread (pysyncobj/syncobj.py:500)"


@pytest.mark.parametrize(
    ("stack", "stage"),
    [
        (
            f"{LOOP};_Counted.data_received (cluster/api/connections.py:150);"
            "RequestHandler.data_received (aiohttp/web_protocol.py:400)",
            "aiohttp and the loop (what the floors spend)",
        ),
        (
            f"{LOOP};metrics_middleware (cluster/api/metrics.py:560);"
            "error_middleware (cluster/api/common.py:40);Response.__init__ (aiohttp/web_response.py:600)",
            "raftmq middlewares",
        ),
        (
            f"{LOOP};SqsHandler.handle (cluster/api/sqs/routes.py:120);"
            "SqsActions.receive_message (cluster/api/sqs/message_actions.py:300);"
            "_render (cluster/node/delivery_actions.py:291);RocksStore.get (storage/rocks.py:300)",
            "store reads on the loop",
        ),
        (
            f"{TICK};SyncObj._onTick (pysyncobj/syncobj.py:600);"
            "QueueGroupMachine.apply (cluster/machines/queue_group.py:90);"
            "RocksStore.write (storage/rocks.py:330)",
            "tick thread: applies (state machines, their RocksDB)",
        ),
        (
            f"{TICK};DurableJournal.add (cluster/replication/journal.py:324)",
            "tick thread: journal",
        ),
        (
            f"{TICK};SyncObj._onTick (pysyncobj/syncobj.py:600);dumps (pysyncobj/pickle.py:10)",
            "tick thread: Raft transport and the rest (pysyncobj)",
        ),
    ],
)
def test_a_sample_goes_to_its_stage(stages: ModuleType, stack: str, stage: str) -> None:
    assert stages.stage_of(stack.split(";")) == stage
