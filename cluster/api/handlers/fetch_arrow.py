"""The Arrow fetch answer: ``GET /v1/topics/{topic}/queues/{queue}/messages`` with ``Accept:
application/vnd.apache.arrow.stream``, an encoder of the fetch core (``fetch_core.py``).

An Arrow IPC stream of one record batch in Kafka's columns (``storage/columns.py``), up to
:data:`ARROW_MAX_ROWS` rows, with the positions in headers (``X-Raftmq-Next-Offset``,
``X-Raftmq-Low-Offset``, ``X-Raftmq-High-Offset``). Same offsets as the JSON answer; it also returns
messages a per-message TTL expired (replay sees every retained message). The read (whole, in one
step) and the encoding run in a thread.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from raftmq.cluster.api.handlers.fetch_core import (
    POSITION_HEADERS,
    Answer,
    FetchBounds,
    FetchQuery,
    position_headers,
)
from raftmq.cluster.config.cluster_file import Limits
from raftmq.storage.store import Store

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ARROW", "ARROW_DEFAULT_BYTES", "ARROW_MAX_ROWS", "ARROW_STREAM", "ArrowEncoder"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
ARROW_MAX_ROWS = 65_536
ARROW_DEFAULT_BYTES = 32 * 1024 * 1024


class ArrowEncoder:
    """The Arrow IPC answer (see the module docstring)."""

    media_type = ARROW_STREAM
    headers = POSITION_HEADERS
    in_executor = True

    def bounds(self, limits: Limits) -> FetchBounds:
        return FetchBounds(ARROW_MAX_ROWS, ARROW_MAX_ROWS, ARROW_DEFAULT_BYTES)

    def reading(self, f: FetchQuery, store: Store) -> _ArrowReading:
        return _ArrowReading(f, store)


ARROW = ArrowEncoder()


class _ArrowReading:
    def __init__(self, f: FetchQuery, store: Store) -> None:
        self.f, self.store = f, store
        self.batch: pa.RecordBatch | None = None
        self.next_offset = f.offset

    def read(self) -> bool:  # in a thread
        # pyarrow is imported by the first Arrow fetch, not by every node at start.
        from raftmq.storage.columns import read_columns

        f = self.f
        self.batch, self.next_offset = read_columns(
            self.store, f.topic.id, f.topic.name, f.queue, f.offset, None, f.max_messages, f.max_bytes
        )
        return bool(self.batch.num_rows)

    async def rest(self) -> None:
        pass  # read whole by read()

    async def answer(self, low: int, high: int) -> Answer:
        from raftmq.storage.columns import batch_to_ipc_stream

        batch = self.batch
        assert batch is not None
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(None, lambda: batch_to_ipc_stream([batch]).to_pybytes())
        return Answer([body], batch.num_rows, position_headers(self.next_offset, low, high))
