"""The consumer's core: owned queues, the delivery buffer, commits, metadata and lifecycle.

:class:`ConsumerCore` lives in one event loop. :class:`~raftmq.client.AsyncConsumer` runs it in
the caller's loop; the sync :class:`~raftmq.client.Consumer` runs it in a background loop thread.
Fetching is in ``_fetcher.py``, group membership (clustering mode) in ``_group_member.py``.

Invariant (at-least-once): the offset committed for a queue is the low edge of its
:class:`~raftmq.client._window.OffsetWindow`, so every offset below a committed offset was finished
by some consumer of the group. A queue is revoked (fetching stopped, undelivered messages dropped,
progress committed) before the coordinator is told the new generation, and the coordinator hands
it to its next owner only then (the revoke barrier), so the next owner starts from the final
progress. Only messages that were delivered but not acked when their queue was revoked are
delivered again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence

from ._api import connect
from ._batches import BatchRun
from ._consumer_config import ConsumerConfig, TopicQueue
from ._fetcher import Fetcher, QueueRun
from ._group_member import GroupMember
from ._metadata import ClusterMetadata
from ._types import Message
from .errors import RaftmqError, TopicNotFound, Unavailable, UnexpectedResponse

__all__ = ["ConsumerCore"]

log = logging.getLogger("raftmq.client.consumer")


class ConsumerCore:
    """Owned queues, their fetch loops, the delivery buffer, commits; create it inside its loop."""

    def __init__(self, bootstrap: str | Sequence[str], config: ConsumerConfig) -> None:
        config.check()
        self.config = config
        self.member_id = config.member_id or f"c-{uuid.uuid4().hex[:16]}"
        self.loop = asyncio.get_running_loop()
        self.api = connect(
            bootstrap, config, retry_timeout_ms=config.request_timeout_ms, address_map=config.address_map
        )
        self.transport, self.backoff = self.api.transport, self.api.backoff
        self.metadata = ClusterMetadata()
        self.fetcher = Fetcher(
            config,
            self.transport,
            self.metadata,
            self.backoff,
            deliver=self._deliver,
            fail=self.fail,
            refresh=self._refresh_soon,
        )
        self.member: GroupMember | None = None
        self.runs: dict[TopicQueue, QueueRun] = {}
        # Fetched, not handed out: messages (JSON answers) and batches decoded as they are taken
        self.buffer: deque[Message | BatchRun] = deque()
        self.available = asyncio.Event()
        self.error: RaftmqError | None = None
        self.closed = False
        self._closing = False
        self._assign_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._releasing: set[QueueRun] = set()  # revoked, final commit pending
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshing: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load metadata, take the first assignment, and start the background loops."""
        for topic in self.config.topics:
            await self._load_topic(topic)
        if self.config.mode == "broadcast":
            everything: set[TopicQueue] = set()
            for topic in self.config.topics:
                desc = self.metadata.topic(topic)
                assert desc is not None
                everything |= {(topic, q) for q in range(desc.queues)}
            await self.acquire(everything)
        else:
            self.member = GroupMember(self)
            await self.member.join()
            self._spawn(self.member.run(), "raftmq-membership")
        self._spawn(self._commit_loop(), "raftmq-commit")
        self._spawn(self._metadata_loop(), "raftmq-metadata")

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(self._guarded(coro))
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, coro: Awaitable[None]) -> None:
        """Run a background loop; a bug in it stops the consumer loudly instead of silently."""
        try:
            await coro
        except Exception as e:
            log.exception("consumer background task failed")
            self.fail(e if isinstance(e, RaftmqError) else UnexpectedResponse(f"client error: {e!r}"))

    async def close(self, commit: bool = True) -> None:
        """Stop fetching, commit the finished offsets (unless ``commit`` is False), leave the group.

        Raises:
            RaftmqError: The final commit failed (the group was still left).
        """
        if self.closed or self._closing:
            return
        self._closing = True
        self.available.set()
        try:
            # Under the lock: a rebalance in progress finishes (and commits) first.
            async with self._assign_lock:
                pending = set(self._tasks)
                while pending:  # cancelled again if one swallowed its cancellation
                    for task in pending:
                        task.cancel()
                    _, pending = await asyncio.wait(pending, timeout=1.0)
                runs = self._revoke(list(self.runs)) + list(self._releasing)
                for run in runs:
                    run.window.revoke()
            try:
                if commit:
                    await self._commit_runs(runs)
            finally:
                if self.config.mode == "clustering":
                    try:
                        await self.api.leave_group(self.config.group, self.member_id)
                    except RaftmqError as e:
                        log.warning("leaving group %s failed: %s", self.config.group, e)
        finally:
            await self.transport.close()
            self.closed = True

    def fail(self, error: RaftmqError) -> None:
        """Stop delivering: the next read raises ``error``."""
        if self.error is None:
            self.error = error
        self.available.set()

    # -- metadata --------------------------------------------------------------------------------

    async def _load_topic(self, topic: str) -> None:
        await self.api.load_topic(self.metadata, topic)

    def _refresh_soon(self, topic: str) -> None:
        if topic in self._refreshing or self._closing:
            return
        self._refreshing.add(topic)

        async def refresh() -> None:
            try:
                await self._load_topic(topic)
            except RaftmqError as e:
                log.debug("metadata refresh of %s failed: %s", topic, e)
            finally:
                self._refreshing.discard(topic)

        self._spawn(refresh(), f"raftmq-metadata-{topic}")

    async def _metadata_loop(self) -> None:
        period_s = self.config.metadata_max_age_ms / 1000
        while True:
            await asyncio.sleep(min(period_s, 1.0))
            for topic in self.metadata.stale_topics(time.monotonic(), period_s):
                self._refresh_soon(topic)

    # -- owning queues ---------------------------------------------------------------------------

    async def release(
        self,
        keep: Iterable[TopicQueue],
        *,
        grace_s: float = 0.0,
        commit_retry_ms: int | None = None,
    ) -> None:
        """Stop every owned queue not in ``keep`` and commit its progress.

        Messages of those queues not handed out yet are dropped at once; for up to ``grace_s`` the
        acks of those already handed out still count (so a rebalance does not deliver them again
        when the application finishes them in time). Then the queues' windows are frozen and their
        low edges committed. A failed commit is logged, not raised: the queue is given up either
        way (its next owner starts from the last committed offset, so some messages are delivered
        again).
        """
        wanted = set(keep)
        async with self._assign_lock:
            if self._closing:
                return
            runs = self._revoke([k for k in self.runs if k not in wanted])
        if not runs:
            return
        self._releasing.update(runs)  # close() commits them if it interrupts this
        t0 = time.monotonic()
        await self._drain(runs, grace_s)
        for run in runs:
            run.window.revoke()
        t1 = time.monotonic()
        try:
            await self._commit_runs(runs, retry_timeout_ms=commit_retry_ms)
        except RaftmqError as e:
            log.warning("committing revoked queues failed (they are given up anyway): %s", e)
        finally:
            self._releasing.difference_update(runs)
        log.debug(
            "revoked %s: acks awaited %.3f s, committed in %.3f s",
            sorted(run.key for run in runs),
            t1 - t0,
            time.monotonic() - t1,
        )

    async def _drain(self, runs: list[QueueRun], grace_s: float) -> None:
        """Wait up to ``grace_s`` until every message handed out of ``runs`` was acked."""
        deadline = time.monotonic() + grace_s
        for run in runs:
            run.resume_at = 1 << 62  # wake at every ack
            while run.window.low_edge < run.stop_offset and not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.info(
                        "revoking %s/%d: %d handed-out messages not acked within %.1f s; they will "
                        "be delivered again",
                        run.topic,
                        run.queue,
                        run.stop_offset - run.window.low_edge,
                        grace_s,
                    )
                    return
                run.paused = True  # the window's on_shrink callback now sets run.resume
                run.resume.clear()
                if run.window.low_edge >= run.stop_offset:
                    break
                try:
                    async with asyncio.timeout(min(remaining, 0.1)):
                        await run.resume.wait()
                except TimeoutError:
                    pass

    async def acquire(self, target: Iterable[TopicQueue]) -> None:
        """Start fetching every queue of ``target`` not owned yet, at the committed offsets."""
        async with self._assign_lock:
            if self._closing:
                return
            by_topic: dict[str, list[int]] = {}
            for topic, q in sorted(k for k in target if k not in self.runs):
                by_topic.setdefault(topic, []).append(q)
            for topic, queues in by_topic.items():
                await self._start_queues(topic, queues)

    async def _start_queues(self, topic: str, queues: list[int]) -> None:
        """Start fetching ``queues`` at their committed offsets (or per the reset policy)."""
        committed = await self.api.committed_offsets(self.config.commit_group, topic)
        starts = {q: committed.get(q) for q in queues}
        missing = [q for q, offset in starts.items() if offset is None]
        for attempt in range(10):
            if not missing:
                break
            if attempt:
                await asyncio.sleep(self.backoff.delay_s(attempt))
            states = (await self.api.describe_topic(topic)).queue_states
            for q in missing:
                state = states[q]
                starts[q] = state.low_offset if self.config.reset == "earliest" else state.high_offset
            missing = [q for q, offset in starts.items() if offset is None]
        if missing:
            raise Unavailable(f"cannot read the bounds of {topic} queues {missing}")
        for q, offset in starts.items():
            assert offset is not None
            resume_at = self.config.max_backlog - self.config.max_batch
            run = QueueRun(topic, q, offset, committed.get(q), self.loop, resume_at)
            self.runs[(topic, q)] = run
            run.task = asyncio.create_task(
                self._guarded(self.fetcher.run(run)), name=f"raftmq-fetch-{topic}-{q}"
            )

    def _revoke(self, keys: Iterable[TopicQueue]) -> list[QueueRun]:
        """Stop fetching ``keys`` and drop their messages not handed out yet; returns their runs,
        each with ``stop_offset``: the first offset not handed out (whose progress is still to be
        committed)."""
        runs = [self.runs.pop(k) for k in keys]
        if not runs:
            return runs
        for run in runs:
            run.stopped = True
            run.stop_offset = run.window.next_offset
            if run.task is not None:
                run.task.cancel()
        gone = {run.key: run for run in runs}
        kept: deque[Message | BatchRun] = deque()
        for m in self.buffer:
            stopping = gone.get((m.topic, m.queue))
            if stopping is None:
                kept.append(m)
            elif m.offset < stopping.stop_offset:  # a BatchRun's offset: its first not handed out
                stopping.stop_offset = m.offset
        self.buffer = kept
        return runs

    # -- committing ------------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.auto_commit_interval_ms / 1000)
            try:
                await self.commit()
            except RaftmqError as e:
                log.warning("commit failed (retried at the next interval): %s", e)

    async def commit(self) -> None:
        """Commit the low edge of every owned queue's window (where it moved)."""
        await self._commit_runs(list(self.runs.values()))

    async def _commit_runs(self, runs: list[QueueRun], *, retry_timeout_ms: int | None = None) -> None:
        # One commit at a time: a periodic commit still in flight cannot land after (and undo) the
        # final commit of a revoked queue.
        async with self._commit_lock:
            by_topic: dict[str, dict[QueueRun, int]] = {}
            for run in runs:
                edge = run.window.low_edge
                if edge != run.committed:
                    by_topic.setdefault(run.topic, {})[run] = edge
            for topic, edges in by_topic.items():
                try:
                    await self.api.commit_offsets(
                        self.config.commit_group,
                        topic,
                        {r.queue: edge for r, edge in edges.items()},
                        # only forward: a late copy of this commit cannot undo a later one
                        advance=True,
                        retry_timeout_ms=retry_timeout_ms,
                    )
                except TopicNotFound as e:
                    self.fail(e)
                    continue
                for run, edge in edges.items():
                    run.committed = edge

    # -- delivering ------------------------------------------------------------------------------

    def _deliver(self, messages: list[Message] | list[BatchRun]) -> None:
        self.buffer.extend(messages)
        self.available.set()

    def buffered(self) -> int:
        """Messages fetched and not handed out yet (expired ones of a batch included)."""
        return sum(1 if isinstance(item, Message) else len(item) for item in self.buffer)

    def take(self, max_messages: int) -> list[Message]:
        """Up to ``max_messages`` buffered messages, without waiting; a batch's messages are made
        here, as many as are taken (``client/_batches.py``)."""
        buffer = self.buffer
        out: list[Message] = []
        while buffer and len(out) < max_messages:
            item = buffer[0]
            if isinstance(item, Message):
                out.append(item)
                buffer.popleft()
                continue
            out += item.take(max_messages - len(out))
            if not len(item):
                buffer.popleft()
        return out

    async def get_many(self, max_messages: int, timeout_s: float | None) -> list[Message]:
        """Up to ``max_messages`` fetched messages, waiting up to ``timeout_s`` for the first.

        Returns an empty list on timeout or once the consumer is closed.

        Raises:
            RaftmqError: A failure that stopped the consumer (e.g. its topic was deleted).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            got = self.take(max_messages)
            if got:  # (empty with a non-empty buffer: only expired records were left)
                return got
            if self.error is not None:
                raise self.error
            if self._closing:
                return []
            self.available.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            try:
                async with asyncio.timeout(remaining):
                    await self.available.wait()
            except TimeoutError:
                return []

    def assignment(self) -> frozenset[TopicQueue]:
        return frozenset(self.runs)
