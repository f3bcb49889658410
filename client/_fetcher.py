"""Fetching one owned queue: its window, and a long-polling fetch loop with fetches in flight."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ._consumer_config import ConsumerConfig
from ._metadata import ClusterMetadata
from ._retry import Backoff
from ._transport import Transport, path_part
from ._types import Message
from ._window import OffsetWindow
from .errors import (
    ConnectionFailed,
    NotLeader,
    OffsetOutOfRange,
    RaftmqError,
    Timeout,
    Unavailable,
    UnknownOutcome,
)

__all__ = ["Fetcher", "QueueRun"]

log = logging.getLogger("raftmq.client.consumer")

_REFRESH_ON = (NotLeader, Unavailable, ConnectionFailed, UnknownOutcome, Timeout)


class QueueRun:
    """One owned queue: its window, its fetch task, and what was last committed for it."""

    def __init__(
        self,
        topic: str,
        queue: int,
        start: int,
        committed: int | None,
        loop: asyncio.AbstractEventLoop,
        resume_at: int = 0,
    ) -> None:
        self.topic = topic
        self.queue = queue
        self.window = OffsetWindow(start)
        self.committed = committed
        self.stopped = False
        self.stop_offset = 0  # once stopped: the first offset not handed out to the application
        self.paused = False
        self.resume_at = resume_at  # window size at which a paused fetch loop is woken
        self.resume = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._loop = loop
        self.window.set_on_shrink(self._shrunk)

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.queue)

    def _shrunk(self) -> None:
        # Called by whichever thread acked (for every ack that moves the low edge): wake the fetch
        # loop, once, when it waits for room and a batch fits again (or anything moved, while
        # draining; see ConsumerCore.release).
        if self.paused and self.window.size <= self.resume_at:
            self.paused = False
            self._loop.call_soon_threadsafe(self.resume.set)


class Fetcher:
    """Runs the fetch loops of a consumer's queues.

    Args:
        deliver: Called (in the loop) with each fetched batch, in offset order per queue.
        fail: Stops the consumer with a non-retriable error.
        refresh: Asks for the topic's metadata to be refreshed (its leaders may have moved).
    """

    def __init__(
        self,
        config: ConsumerConfig,
        transport: Transport,
        metadata: ClusterMetadata,
        backoff: Backoff,
        *,
        deliver: Callable[[list[Message]], None],
        fail: Callable[[RaftmqError], None],
        refresh: Callable[[str], None],
    ) -> None:
        self.config = config
        self.transport = transport
        self.metadata = metadata
        self.backoff = backoff
        self._deliver = deliver
        self._fail = fail
        self._refresh = refresh

    async def run(self, run: QueueRun) -> None:
        """Fetch ``run``'s queue in order, long-polling at its end.

        While the queue holds more than one batch beyond what was fetched (``high_offset`` of the
        last answer says so), up to ``max_fetches_in_flight`` fetches of consecutive ranges are in
        flight at once; their answers are taken in offset order. Any surprise (an error, a short
        or empty answer) cancels the fetches behind it and continues from the window's next offset.
        """
        cfg = self.config
        inflight: deque[tuple[int, asyncio.Task[Any]]] = deque()  # (count, fetch), in offset order
        next_request = run.window.next_offset
        known_high = 0
        failures = 0

        def cancel_all() -> int:
            for _, task in inflight:
                task.cancel()
            inflight.clear()
            return run.window.next_offset

        try:
            while not run.stopped:
                while len(inflight) < cfg.max_fetches_in_flight:
                    requested = next_request - run.window.next_offset
                    room = cfg.max_backlog - run.window.size - requested
                    if room < cfg.max_batch or (inflight and next_request >= known_high):
                        break
                    wait_ms = 0 if inflight else cfg.wait_ms
                    inflight.append(
                        (cfg.max_batch, asyncio.ensure_future(self._fetch(run, next_request, wait_ms)))
                    )
                    next_request += cfg.max_batch
                if not inflight:
                    # Local flow control: wait until the application finished enough messages.
                    run.paused = True
                    run.resume.clear()
                    if cfg.max_backlog - run.window.size < cfg.max_batch:
                        await run.resume.wait()
                    run.paused = False
                    continue
                count, task = inflight[0]
                offset = run.window.next_offset
                try:
                    answer = await task
                except OffsetOutOfRange as e:
                    next_request = cancel_all()
                    restart = self._reset_offset(e)
                    log.warning(
                        "offset %d of %s/%d is out of range [%s, %s]; continuing at %d (%s)",
                        offset,
                        run.topic,
                        run.queue,
                        e.low_offset,
                        e.high_offset,
                        restart,
                        cfg.reset,
                    )
                    run.window.jump(restart)
                    next_request = restart
                    continue
                except RaftmqError as e:
                    next_request = cancel_all()
                    if not e.retriable:
                        self._fail(e)
                        return
                    failures += 1
                    if isinstance(e, _REFRESH_ON):
                        self._refresh(run.topic)
                    await asyncio.sleep(self.backoff.delay_s(failures))
                    continue
                inflight.popleft()
                failures = 0
                known_high = max(known_high, answer["high_offset"])
                messages = answer["messages"]
                if run.stopped:
                    return
                if not messages:
                    next_request = cancel_all()
                    continue
                first = messages[0]["offset"]
                if first != run.window.next_offset:  # retention removed what we asked for
                    next_request = cancel_all()
                    run.window.jump(first)
                run.window.add(first, len(messages))
                window = run.window
                self._deliver([Message.from_wire(run.topic, run.queue, m, window) for m in messages])
                if len(messages) < count:  # e.g. max_bytes cut it short: the fetches behind have a gap
                    next_request = cancel_all()
        finally:
            cancel_all()

    async def _fetch(self, run: QueueRun, offset: int, wait_ms: int) -> Any:
        return await self.transport.request(
            "GET",
            f"/v1/topics/{path_part(run.topic)}/queues/{run.queue}/messages",
            params={"offset": offset, "max": self.config.max_batch, "wait_ms": wait_ms},
            node_url=self.metadata.leader_url(run.topic, run.queue),
            idempotent=True,
            extra_timeout_ms=wait_ms,
        )

    def _reset_offset(self, e: OffsetOutOfRange) -> int:
        low, high = e.low_offset or 0, e.high_offset or 0
        return low if self.config.reset == "earliest" else high
