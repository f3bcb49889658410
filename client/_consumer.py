"""The consumer: membership, one long-polling fetch loop per owned queue, windows and commits.

:class:`ConsumerCore` lives in one event loop. :class:`AsyncConsumer` runs it in the caller's loop;
the sync :class:`~raftmq.client.Consumer` runs it in a background loop thread.

Invariant (at-least-once): the offset committed for a queue is the low edge of its
:class:`OffsetWindow`, so every offset below a committed offset was finished by some consumer of the
group. A rebalance may deliver a message twice (the old and the new owner overlap until the old one
sees the new generation), never zero times.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._api import ApiClient
from ._metadata import ClusterMetadata
from ._retry import Backoff
from ._transport import Transport, path_part
from ._types import Message
from ._window import OffsetWindow
from .errors import (
    ClientClosed,
    ConnectionFailed,
    NotLeader,
    OffsetOutOfRange,
    RaftmqError,
    Timeout,
    TopicNotFound,
    Unavailable,
    UnexpectedResponse,
    UnknownOutcome,
)

__all__ = ["AsyncConsumer", "ConsumerConfig", "ConsumerCore", "Mode", "Reset", "TopicQueue"]

log = logging.getLogger("raftmq.client.consumer")

Mode = Literal["clustering", "broadcast"]
Reset = Literal["earliest", "latest"]
TopicQueue = tuple[str, int]

MAX_NAME_BYTES = 255  # of a consumer group name and of a member id (the broker's limit)


def _name_ok(name: str) -> bool:
    try:
        return 1 <= len(name.encode()) <= MAX_NAME_BYTES
    except UnicodeEncodeError:  # a lone surrogate
        return False


_REFRESH_ON = (NotLeader, Unavailable, ConnectionFailed, UnknownOutcome, Timeout)


@dataclass(frozen=True)
class ConsumerConfig:
    """The consumer's settings (see :class:`AsyncConsumer` for their meaning)."""

    group: str
    topics: tuple[str, ...]
    mode: Mode = "clustering"
    member_id: str | None = None
    max_batch: int = 32
    wait_ms: int = 5_000
    max_backlog: int = 1_000
    max_fetches_in_flight: int = 4
    auto_commit_interval_ms: int = 1_000
    reset: Reset = "earliest"
    auto_ack: bool = False
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 2_000
    metadata_max_age_ms: int = 30_000

    def check(self) -> None:
        problems = []
        if not _name_ok(self.group):
            problems.append(f"group must be 1-{MAX_NAME_BYTES} UTF-8 bytes")
        if not self.topics:
            problems.append("subscribe to at least one topic")
        if self.mode not in ("clustering", "broadcast"):
            problems.append("mode must be 'clustering' or 'broadcast'")
        if self.mode == "broadcast" and self.member_id is None:
            problems.append(
                "broadcast mode needs a stable member_id: its progress is committed as "
                "'<group>.<member_id>' and resumes from there after a restart"
            )
        if self.member_id is not None and not _name_ok(self.member_id):
            problems.append(f"member_id must be 1-{MAX_NAME_BYTES} UTF-8 bytes")
        elif self.mode == "broadcast" and not _name_ok(self.commit_group):
            problems.append(f"'<group>.<member_id>' must be at most {MAX_NAME_BYTES} UTF-8 bytes")
        if self.reset not in ("earliest", "latest"):
            problems.append("reset must be 'earliest' or 'latest'")
        if not 1 <= self.max_batch <= 10_000:
            problems.append("max_batch must be from 1 to 10,000")
        if not 0 <= self.wait_ms <= 15_000:
            problems.append("wait_ms must be from 0 to 15,000")
        if self.max_backlog < self.max_batch:
            problems.append("max_backlog must be at least max_batch")
        if self.max_fetches_in_flight < 1:
            problems.append("max_fetches_in_flight must be at least 1")
        if self.auto_commit_interval_ms <= 0:
            problems.append("auto_commit_interval_ms must be positive")
        if problems:
            raise ValueError("invalid consumer settings: " + "; ".join(problems))

    @property
    def commit_group(self) -> str:
        """The consumer group offsets are committed under: ``group``, or in broadcast mode
        ``group.member_id`` (each broadcast consumer has its own progress)."""
        return self.group if self.mode == "clustering" else f"{self.group}.{self.member_id}"


class _QueueRun:
    """One owned queue: its window, its fetch task, and what was last committed for it."""

    def __init__(self, topic: str, queue: int, start: int, committed: int | None, loop: Any) -> None:
        self.topic = topic
        self.queue = queue
        self.window = OffsetWindow(start)
        self.committed = committed
        self.stopped = False
        self.paused = False
        self.resume = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._loop = loop
        self.window.set_on_shrink(self._shrunk)

    def _shrunk(self) -> None:
        # Called by whichever thread acked; only matters while the fetch loop waits for room.
        if self.paused:
            self._loop.call_soon_threadsafe(self.resume.set)


class ConsumerCore:
    """Owned queues, their fetch loops, the delivery buffer, commits; create it inside its loop."""

    def __init__(self, bootstrap: str | Sequence[str], config: ConsumerConfig) -> None:
        config.check()
        self.config = config
        self.member_id = config.member_id or f"c-{uuid.uuid4().hex[:16]}"
        self.loop = asyncio.get_running_loop()
        self.transport = Transport(bootstrap, request_timeout_ms=config.request_timeout_ms)
        self.backoff = Backoff(config.retry_backoff_ms, config.retry_backoff_max_ms)
        self.api = ApiClient(self.transport, retry_timeout_ms=config.request_timeout_ms, backoff=self.backoff)
        self.metadata = ClusterMetadata()
        self.generation: int | None = None
        self._handover: dict[TopicQueue, float] = {}  # assigned queues not started yet: start time
        self.runs: dict[TopicQueue, _QueueRun] = {}
        self.buffer: deque[Message] = deque()
        self.available = asyncio.Event()
        self.error: RaftmqError | None = None
        self.closed = False
        self._closing = False
        self._assign_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshing: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load metadata, take the first assignment, and start the background loops."""
        for topic in self.config.topics:
            await self._load_topic(topic)
        if self.config.mode == "broadcast":
            everything = set()
            for topic in self.config.topics:
                desc = self.metadata.topic(topic)
                assert desc is not None
                everything |= {(topic, q) for q in range(desc.queues)}
            await self._assign(everything)
        else:
            view = await self.api.join_group(self.config.group, self.member_id, self.config.topics)
            await self._apply_view(view)
            self._spawn(self._membership_loop(view), "raftmq-membership")
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
        """Stop fetching, commit the finished offsets (unless ``commit`` is False), leave the group."""
        if self.closed or self._closing:
            return
        self._closing = True
        self.available.set()
        try:
            # Under the lock: a rebalance in progress finishes (and commits) first.
            async with self._assign_lock:
                tasks = list(self._tasks)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self._revoke(list(self.runs), commit=commit)
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
        desc = await self.api.describe_topic(topic)
        leaders = {q.leader for q in desc.queue_states if q.leader}
        if not all(self.metadata.leader_known(n) for n in leaders):
            self.metadata.update_cluster(await self.api.cluster_status())
        self.metadata.update_topic(desc, time.monotonic())

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

    # -- membership ------------------------------------------------------------------------------

    async def _membership_loop(self, view: dict[str, Any]) -> None:
        """Heartbeat; follow the assignment; give up every queue when the coordinator has not
        answered for a session timeout (it has dropped this member and reassigned its queues)."""
        last_ok = time.monotonic()
        interval_s = view["heartbeat_interval_ms"] / 1000
        session_s = view["session_timeout_ms"] / 1000
        failures = 0
        next_beat = last_ok + interval_s
        while True:
            wake = next_beat
            if self._handover:
                wake = min(wake, min(self._handover.values()))
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
            if time.monotonic() < next_beat:
                try:
                    await self._start_due()
                except RaftmqError as e:
                    if not e.retriable:
                        self.fail(e)
                        return
                    log.warning("starting assigned queues failed (retried): %s", e)
                    retry_at = time.monotonic() + interval_s
                    self._handover = {k: max(at, retry_at) for k, at in self._handover.items()}
                continue
            try:
                view = await self.api.join_group(
                    self.config.group, self.member_id, self.config.topics, retry=False
                )
            except RaftmqError as e:
                failures += 1
                next_beat = time.monotonic() + self.backoff.delay_s(failures)
                if not e.retriable:
                    self.fail(e)
                    return
                if time.monotonic() - last_ok > session_s and (self.runs or self._handover):
                    log.warning("no heartbeat answer for %.1f s; giving up all queues", session_s)
                    self._handover.clear()
                    await self._assign(set())
                continue
            failures = 0
            last_ok = time.monotonic()
            interval_s = view["heartbeat_interval_ms"] / 1000
            session_s = view["session_timeout_ms"] / 1000
            next_beat = last_ok + interval_s
            try:
                await self._apply_view(view)
            except RaftmqError as e:
                if not e.retriable:
                    self.fail(e)
                    return
                log.warning("taking the assignment failed (retried at the next heartbeat): %s", e)

    async def _apply_view(self, view: dict[str, Any]) -> None:
        """Follow the coordinator's assignment.

        Revoked queues are dropped at once (after committing their progress). A newly assigned
        queue starts at once when this is the group's only member; otherwise only after a handover
        grace of 1.5 heartbeat intervals, by when its previous owner has seen the new generation and
        committed its final progress: fewer messages delivered twice, at the price of a short pause.
        """
        target = {(t, q) for t, queues in view["assignment"].items() for q in queues}
        if view["generation"] != self.generation:
            log.info(
                "assignment generation=%s member=%s queues=%s",
                view["generation"],
                self.member_id,
                sorted(target),
            )
            self.generation = view["generation"]
        grace_s = 1.5 * view["heartbeat_interval_ms"] / 1000 if len(view["members"]) > 1 else 0.0
        now = time.monotonic()
        for key in list(self._handover):
            if key not in target:
                del self._handover[key]
        for key in target:
            if key not in self.runs and key not in self._handover:
                self._handover[key] = now + grace_s
        revoked = [k for k in self.runs if k not in target]
        if revoked:
            async with self._assign_lock:
                if not self._closing:
                    await self._revoke(revoked, commit=True)
        await self._start_due()

    async def _start_due(self) -> None:
        now = time.monotonic()
        due = sorted(k for k, at in self._handover.items() if at <= now)
        if not due:
            return
        async with self._assign_lock:
            if self._closing:
                return
            by_topic: dict[str, list[int]] = {}
            for topic, q in due:
                by_topic.setdefault(topic, []).append(q)
            for topic, queues in by_topic.items():
                await self._start_queues(topic, queues)
                for q in queues:
                    self._handover.pop((topic, q), None)

    async def _assign(self, target: set[TopicQueue]) -> None:
        """Own exactly ``target`` now (broadcast mode; and giving up everything)."""
        async with self._assign_lock:
            if self._closing:
                return
            await self._revoke([k for k in self.runs if k not in target], commit=True)
            added = sorted(k for k in target if k not in self.runs)
            by_topic: dict[str, list[int]] = {}
            for topic, q in added:
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
            run = _QueueRun(topic, q, offset, committed.get(q), self.loop)
            self.runs[(topic, q)] = run
            run.task = asyncio.create_task(
                self._guarded(self._fetch_loop(run)), name=f"raftmq-fetch-{topic}-{q}"
            )

    async def _revoke(self, keys: Iterable[TopicQueue], *, commit: bool) -> None:
        """Stop fetching ``keys``, drop their undelivered messages, and commit their progress."""
        runs = [self.runs.pop(k) for k in keys]
        if not runs:
            return
        for run in runs:
            run.stopped = True
            if run.task is not None:
                run.task.cancel()
        await asyncio.gather(*(r.task for r in runs if r.task is not None), return_exceptions=True)
        gone = {(r.topic, r.queue) for r in runs}
        self.buffer = deque(m for m in self.buffer if (m.topic, m.queue) not in gone)
        if commit:
            await self._commit_runs(runs)

    # -- fetching --------------------------------------------------------------------------------

    async def _fetch_loop(self, run: _QueueRun) -> None:
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
                        self.fail(e)
                        return
                    failures += 1
                    if isinstance(e, _REFRESH_ON):
                        self._refresh_soon(run.topic)
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
                self.buffer.extend(Message.from_wire(run.topic, run.queue, m, run.window) for m in messages)
                self.available.set()
                if len(messages) < count:  # e.g. max_bytes cut it short: the fetches behind have a gap
                    next_request = cancel_all()
        finally:
            cancel_all()

    async def _fetch(self, run: _QueueRun, offset: int, wait_ms: int) -> Any:
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

    async def _commit_runs(self, runs: list[_QueueRun]) -> None:
        by_topic: dict[str, dict[_QueueRun, int]] = {}
        for run in runs:
            edge = run.window.low_edge
            if edge != run.committed:
                by_topic.setdefault(run.topic, {})[run] = edge
        for topic, edges in by_topic.items():
            try:
                await self.api.commit_offsets(
                    self.config.commit_group, topic, {r.queue: edge for r, edge in edges.items()}
                )
            except TopicNotFound as e:
                self.fail(e)
                continue
            for run, edge in edges.items():
                run.committed = edge

    # -- delivering ------------------------------------------------------------------------------

    async def get_many(self, max_messages: int, timeout_s: float | None) -> list[Message]:
        """Up to ``max_messages`` fetched messages, waiting up to ``timeout_s`` for the first.

        Returns an empty list on timeout or once the consumer is closed.

        Raises:
            RaftmqError: A failure that stopped the consumer (e.g. its topic was deleted).
        """
        if not self.buffer:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not self.buffer:
                if self.error is not None:
                    raise self.error
                if self._closing:
                    return []
                self.available.clear()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                try:
                    await asyncio.wait_for(self.available.wait(), remaining)
                except TimeoutError:
                    return []
        buffer = self.buffer
        n = min(max_messages, len(buffer))
        return [buffer.popleft() for _ in range(n)]

    def assignment(self) -> frozenset[TopicQueue]:
        return frozenset(self.runs)


Handler = Callable[[Message], Awaitable[None]]


class AsyncConsumer:
    """Consumes topics with committed progress (asyncio).

    Two modes:

    - ``"clustering"`` (default): the consumers of ``group`` share the topics' queues; the broker
      assigns each queue to one live member (average allocation over sorted member ids) and the
      consumer follows the assignment as members join and leave. Progress is committed under
      ``group``.
    - ``"broadcast"``: this consumer reads every queue with its own progress, committed under
      ``f"{group}.{member_id}"`` (``member_id`` is required and must be stable across restarts).

    Read messages by iteration and ack each once processed, or hand a coroutine to :meth:`run`::

        async with AsyncConsumer(brokers, group="billing", topics=["orders"]) as consumer:
            async for msg in consumer:
                await handle(msg)
                msg.ack()

    The committed offset of a queue is the low edge of its acked offsets (a message that is not
    acked holds it back), committed every ``auto_commit_interval_ms``, on rebalance and on close.
    After a restart the group resumes from there: a message is delivered again unless its ack was
    committed (at-least-once).

    Args:
        bootstrap: Node addresses; any one will do.
        group: The consumer group (1-255 UTF-8 bytes).
        topics: The topics to consume.
        mode: ``"clustering"`` or ``"broadcast"``.
        member_id: This consumer's id in the group (default: random; required for broadcast).
        max_batch: Messages per fetch.
        wait_ms: Long-poll wait of a fetch when a queue has nothing new (at most 15,000).
        max_backlog: Per queue, delivered-but-uncommittable messages (unacked, or acked behind an
            unacked one) at which fetching that queue pauses.
        max_fetches_in_flight: Per queue, fetches of consecutive ranges sent at once while the
            queue holds more than one batch beyond what was fetched (a lagging consumer catches up
            faster); at the end of the queue a single fetch long-polls.
        auto_commit_interval_ms: How often finished offsets are committed.
        reset: Where to start a queue without a committed offset, or whose offset is out of range
            (retention removed it): ``"earliest"`` or ``"latest"``.
        auto_ack: Iteration acks the previous message when the next one is requested.
        request_timeout_ms: One request's timeout.
        retry_backoff_ms, retry_backoff_max_ms: Backoff after failed fetches and commits.
        metadata_max_age_ms: How often queue leaders are refreshed.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        group: str,
        topics: str | Sequence[str],
        mode: Mode = "clustering",
        member_id: str | None = None,
        max_batch: int = 32,
        wait_ms: int = 5_000,
        max_backlog: int = 1_000,
        max_fetches_in_flight: int = 4,
        auto_commit_interval_ms: int = 1_000,
        reset: Reset = "earliest",
        auto_ack: bool = False,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 2_000,
        metadata_max_age_ms: int = 30_000,
    ) -> None:
        self._bootstrap = bootstrap
        self._config = ConsumerConfig(
            group=group,
            topics=(topics,) if isinstance(topics, str) else tuple(topics),
            mode=mode,
            member_id=member_id,
            max_batch=max_batch,
            wait_ms=wait_ms,
            max_backlog=max_backlog,
            max_fetches_in_flight=max_fetches_in_flight,
            auto_commit_interval_ms=auto_commit_interval_ms,
            reset=reset,
            auto_ack=auto_ack,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._config.check()
        self._core: ConsumerCore | None = None
        self._last: Message | None = None
        self._closed = False

    @property
    def member_id(self) -> str | None:
        """This consumer's id in its group (known once started)."""
        return self._core.member_id if self._core else self._config.member_id

    @property
    def commit_group(self) -> str:
        """The consumer group its offsets are committed under."""
        return self._config.commit_group

    async def start(self) -> None:
        """Join the group (or take every queue, in broadcast mode) and start fetching."""
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if self._core is None:
            core = ConsumerCore(self._bootstrap, self._config)
            try:
                await core.start()
            except BaseException:
                await core.close(commit=False)
                raise
            self._core = core

    def _started(self) -> ConsumerCore:
        if self._core is None:
            raise RuntimeError("start the consumer first (await consumer.start() or async with)")
        return self._core

    def assignment(self) -> frozenset[TopicQueue]:
        """The (topic, queue) pairs this consumer currently owns."""
        return self._core.assignment() if self._core else frozenset()

    async def getmany(self, max_messages: int = 1_000, timeout_ms: int | None = None) -> list[Message]:
        """Up to ``max_messages`` messages, waiting up to ``timeout_ms`` (None: until one arrives
        or the consumer is closed). Returns [] on timeout or once closed."""
        return await self._started().get_many(max_messages, None if timeout_ms is None else timeout_ms / 1000)

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Message:
        if self._last is not None and self._config.auto_ack:
            self._last.ack()
        self._last = None
        core = self._started()
        if core.buffer:
            message = core.buffer.popleft()
        else:
            got = await core.get_many(1, None)
            if not got:
                raise StopAsyncIteration
            message = got[0]
        self._last = message
        return message

    async def run(self, handler: Handler, *, concurrency: int = 1, ordered: bool = True) -> None:
        """Process messages with ``handler`` until the consumer is closed; ack each on success.

        Args:
            handler: ``async def handler(msg)``; the message is acked when it returns.
            concurrency: Handlers running at once.
            ordered: True: one message at a time per queue, in offset order (queues in parallel).
                False: any messages in parallel.

        Raises:
            Exception: The first exception of ``handler``; ``run`` stops taking messages, waits for
                the running handlers, and re-raises it (the failed message stays unacked, so it is
                delivered again after a restart).
        """
        core = self._started()
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        slots = asyncio.Semaphore(concurrency)
        lanes: dict[TopicQueue, deque[Message]] = {}
        running: set[asyncio.Task[None]] = set()
        failure: list[BaseException] = []
        stop = asyncio.Event()

        async def call(message: Message) -> bool:
            if failure:
                return False
            try:
                await handler(message)
            except Exception as e:
                failure.append(e)
                stop.set()
                return False
            message.ack()
            return True

        async def lane(key: TopicQueue) -> None:
            queue = lanes[key]
            try:
                while queue:
                    async with slots:
                        if not await call(queue[0]):
                            return
                    queue.popleft()
            finally:
                del lanes[key]

        async def single(message: Message) -> None:
            try:
                await call(message)
            finally:
                slots.release()

        def spawn(coro: Awaitable[None]) -> None:
            task: asyncio.Task[None] = asyncio.ensure_future(coro)
            running.add(task)
            task.add_done_callback(running.discard)

        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(core.get_many(1_000, None))
                await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                batch = getter.result()
                if not batch:
                    break
                for message in batch:
                    if ordered:
                        key = (message.topic, message.queue)
                        if key in lanes:
                            lanes[key].append(message)
                        else:
                            lanes[key] = deque([message])
                            spawn(lane(key))
                    else:
                        await slots.acquire()
                        if stop.is_set():
                            slots.release()
                            break
                        spawn(single(message))
        finally:
            stopper.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        if failure:
            raise failure[0]

    async def commit(self) -> None:
        """Commit finished offsets now (also done every ``auto_commit_interval_ms``)."""
        await self._started().commit()

    async def committed(self, topic: str) -> dict[int, int | None]:
        """The group's committed offset of each queue of ``topic`` (None where none)."""
        core = self._started()
        return await core.api.committed_offsets(self._config.commit_group, topic)

    async def close(self, *, commit: bool = True) -> None:
        """Stop fetching, commit finished offsets (unless ``commit`` is False), leave the group."""
        self._closed = True
        if self._core is not None:
            await self._core.close(commit=commit)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
