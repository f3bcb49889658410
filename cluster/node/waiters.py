"""Tasks on a node's loop that wait for a queue of a local replica to grow (fetch long polls,
receive waits), and whether any is watching at all: the tick threads read that to skip waking
the loop for an apply nobody on this node waits for.

A watcher reads the replica, then waits only if it found nothing; an apply between the two must
still wake it. Invariant: a watcher counts itself in (:meth:`QueueWaiters.watch`) before its
first read, and a tick thread reads :attr:`QueueWaiters.watching` after the apply's write. So
either the tick thread sees the watcher and wakes the loop (as it always did), or the watcher's
read comes after the write and finds what it brought.

Threads: everything here runs on the loop but :attr:`QueueWaiters.watching`, read by the tick
threads (an int, written on the loop only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["QueueWaiters", "set_if_pending"]


def set_if_pending(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class QueueWaiters:
    """The futures waiting per ``(topic_id, queue)`` of this node's replicas."""

    def __init__(self) -> None:
        self._futures: dict[tuple[int, int], list[asyncio.Future[None]]] = defaultdict(list)
        self.watching = 0  # watchers between watch()'s start and end (loop only; tick threads read)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Around a loop that reads a replica's queues and waits (:meth:`wait`) for them to grow:
        while one runs, every apply that grows a queue here wakes the loop."""
        self.watching += 1
        try:
            yield
        finally:
            self.watching -= 1

    def wake(self, queues: Iterable[tuple[int, int]]) -> None:
        for key in queues:
            for future in self._futures.pop(key, ()):
                set_if_pending(future, None)

    async def wait(self, topic_id: int, queue: int, timeout_s: float) -> None:
        """Return when the queue grows on this replica (:meth:`wake`), or after ``timeout_s``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._futures[(topic_id, queue)]
        waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            if future in waiters:
                waiters.remove(future)
