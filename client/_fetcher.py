"""Fetching one owned queue: its window, and a long-polling fetch loop with fetches in flight."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ._batches import Batches, BatchRun, NotAccepted, ack_expired, batch_runs, get_batches
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
        deliver: Callable[[list[Message] | list[BatchRun]], None],
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
        self.binary = config.wire == "binary"  # False once a node refused the binary answer

    async def run(self, run: QueueRun) -> None:
        """Fetch ``run``'s queue in order, long-polling at its end.

        While the queue holds more than one batch beyond what was fetched (``high_offset`` of the
        last answer says so), up to ``max_fetches_in_flight`` fetches of consecutive ranges are in
        flight at once; their answers are taken in offset order. Any surprise (an error, a short
        or empty answer) cancels the fetches behind it and continues from the window's next offset.
        """
        cfg = self.config
        # (offset, count, fetch), in offset order
        inflight: deque[tuple[int, int, asyncio.Task[Any]]] = deque()
        next_request = run.window.next_offset
        # Offsets between the fetches in flight: max_batch, or for binary answers (whole batches)
        # the span the last one covered, so that fetches in flight start where batches do rather
        # than several of them answering the same large batch.
        stride = cfg.max_batch
        known_high = 0
        failures = 0

        def cancel_all() -> int:
            for _, _, task in inflight:
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
                    task = asyncio.ensure_future(self._fetch(run, next_request, wait_ms))
                    inflight.append((next_request, cfg.max_batch, task))
                    next_request += stride
                if not inflight:
                    # Local flow control: wait until the application finished enough messages.
                    run.paused = True
                    run.resume.clear()
                    if cfg.max_backlog - run.window.size < cfg.max_batch:
                        await run.resume.wait()
                    run.paused = False
                    continue
                _, count, task = inflight[0]
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
                if run.stopped:
                    return
                if isinstance(answer, Batches):
                    known_high = max(known_high, answer.high_offset)
                    before = run.window.next_offset
                    next_request = self._take_batches(run, answer, inflight, next_request)
                    if run.window.next_offset > before:
                        stride = max(cfg.max_batch, answer.next_offset - before)
                    continue
                known_high = max(known_high, answer["high_offset"])
                messages = answer["messages"]
                if not messages:
                    next_request = cancel_all()
                    continue
                first = messages[0]["offset"]
                if first != run.window.next_offset:  # retention removed what we asked for
                    next_request = cancel_all()
                    run.window.jump(first)
                end = messages[-1]["offset"] + 1
                window = run.window
                window.add(first, end - first)
                if end - first != len(messages):  # expired messages left out: they count as finished
                    for gone in sorted(set(range(first, end)) - {m["offset"] for m in messages}):
                        window.ack(gone)
                self._deliver([Message.from_wire(run.topic, run.queue, m, window) for m in messages])
                if end - first < count:  # e.g. max_bytes cut it short: the fetches behind have a gap
                    next_request = cancel_all()
        finally:
            cancel_all()

    def _take_batches(
        self,
        run: QueueRun,
        answer: Batches,
        inflight: deque[tuple[int, int, asyncio.Task[Any]]],
        next_request: int,
    ) -> int:
        """Deliver a binary answer's batches from the window's next offset on (as lazy
        :class:`BatchRun` s); returns the next offset to request.

        An answer holds whole batches, so it may begin before the offset asked for (the records
        below are skipped) and end past the range asked for: the fetches behind that it covers are
        cancelled. What would take the window past ``max_backlog`` is dropped (fetched again once
        acks made room), so the bound holds however large the stored batches are. An answer that
        begins after the window's next offset (the fetch ahead of it came back short) is dropped
        with everything behind it, and fetching continues where the window is.
        """
        window = run.window
        start = window.next_offset

        def restart() -> int:
            for _, _, task in inflight:
                task.cancel()
            inflight.clear()
            return window.next_offset

        runs, first, end = batch_runs(run.topic, run.queue, answer, start, window)
        if not runs:
            # Nothing new: an empty answer (the end of the queue, or all of it older than asked
            # for); a fetch behind an answer that went further has nothing to add.
            return restart() if not answer.views else max(next_request, start)
        if first != start:
            return restart()
        room = self.config.max_backlog - window.size
        if room <= 0:  # an answer that was in flight when the window filled up
            return restart()
        if end - first > room:  # a large batch: deliver what max_backlog allows, fetch the rest later
            end = first + room
            runs = [r for r in runs if r.offset < end]
            runs[-1].end = min(runs[-1].end, end)
        window.add(first, end - first)
        if any(r.skip for r in runs):
            ack_expired(runs, window)
        self._deliver(runs)
        while inflight and inflight[0][0] < end:  # covered by this answer
            inflight.popleft()[2].cancel()
        if not inflight:
            return end
        if inflight[0][0] > end:  # this answer came back short: a gap before the next
            return restart()
        return max(next_request, end)

    async def _fetch(self, run: QueueRun, offset: int, wait_ms: int) -> Any:
        path = f"/v1/topics/{path_part(run.topic)}/queues/{run.queue}/messages"
        params = {"offset": offset, "max": self.config.max_batch, "wait_ms": wait_ms}
        node_url = self.metadata.leader_url(run.topic, run.queue)
        if self.binary:
            try:
                return await get_batches(
                    self.transport, path, params, node_url=node_url, extra_timeout_ms=wait_ms
                )
            except NotAccepted as e:
                log.warning("%s; fetching JSON from now on", e)
                self.binary = False
        return await self.transport.request(
            "GET", path, params=params, node_url=node_url, idempotent=True, extra_timeout_ms=wait_ms
        )

    def _reset_offset(self, e: OffsetOutOfRange) -> int:
        low, high = e.low_offset or 0, e.high_offset or 0
        return low if self.config.reset == "earliest" else high
