"""The producer tells its event loop's thread from the others by the loop that thread runs, not
by the thread's identifier: the OS gives an ended thread's identifier to a thread started after
it (most times here), so a producer whose loop ran first in a thread that has ended took such a
thread for its own I/O thread. Both guards are shown misjudging it: a handle's ``result`` (which
refuses to block the loop thread) and the producer's ``wake`` (which touches the loop's objects
directly only from the loop's thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from client_producer_fakes import FakeCluster, start_producer

from raftmq.client import AsyncProducer, FutureRecord
from raftmq.client._outcome import BatchOutcome
from raftmq.client._producer import ProducerCore

T = TypeVar("T")


def _run_in_a_thread_that_ends(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]
) -> tuple[int, T]:
    """Run ``coro`` in ``loop`` in a new thread; that thread's identifier once it ended, and
    ``coro``'s result."""
    results: list[T] = []
    thread = threading.Thread(target=lambda: results.append(loop.run_until_complete(coro)))
    thread.start()
    thread.join()
    assert thread.ident is not None
    return thread.ident, results[0]


def _in_a_new_thread(job: Callable[[], object]) -> tuple[int, list[object]]:
    """Run ``job`` in a new thread; its identifier and what ``job`` returned or raised."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(job())
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    assert thread.ident is not None
    return thread.ident, outcome


async def _producer_with_a_lingering_message() -> tuple[AsyncProducer, FutureRecord]:
    producer = await start_producer(FakeCluster(), linger_ms=60_000)
    return producer, await producer.send("t", "v", queue=1)


def _waits_for_a_handle() -> bool:
    """One attempt; True if the new thread got the ended loop thread's identifier."""
    loop = asyncio.new_event_loop()
    ended, (producer, handle) = _run_in_a_thread_that_ends(loop, _producer_with_a_lingering_message())
    ident, outcome = _in_a_new_thread(lambda: handle.exception(timeout=0))
    # Not stored yet (the message lingers): a thread outside the loop waits, here 0 s.
    assert [type(o) for o in outcome] == [TimeoutError], (ident == ended, outcome)
    loop.run_until_complete(producer.close())
    assert handle.result(timeout=0).offset == 0
    loop.close()
    return ident == ended


def test_a_thread_given_the_ended_loop_thread_s_identifier_waits_for_a_handle() -> None:
    reused = sum(_waits_for_a_handle() for _ in range(20))
    assert reused, "no new thread got the ended thread's identifier: nothing was shown"


async def _wake_from_a_new_thread(core: ProducerCore) -> tuple[int, list[object]]:
    while not core._wakeup._waiters:  # until the sender waits for a wake-up
        await asyncio.sleep(0)
    return _in_a_new_thread(core.wake)  # (blocks the loop until that thread ended)


def _wakes_the_sender() -> bool:
    """One attempt; True if the new thread got the ended loop thread's identifier."""
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    ended, producer = _run_in_a_thread_that_ends(loop, start_producer(FakeCluster(), linger_ms=60_000))
    assert producer._core is not None
    ident, outcome = loop.run_until_complete(_wake_from_a_new_thread(producer._core))
    assert outcome == [None], (ident == ended, outcome)
    loop.run_until_complete(producer.close())
    loop.close()
    return ident == ended


def test_a_thread_given_the_ended_loop_thread_s_identifier_wakes_the_sender_thread_safely() -> None:
    """In debug mode asyncio refuses a callback scheduled from outside the loop's thread (which
    would not wake a loop waiting in ``select``: the wake-up would be lost)."""
    reused = sum(_wakes_the_sender() for _ in range(20))
    assert reused, "no new thread got the ended thread's identifier: nothing was shown"


def test_a_handle_whose_producers_loop_is_closed_refuses_to_wait_for_ever() -> None:
    """Nothing will finish a batch once its producer's loop is closed (an ``AsyncProducer`` left
    unclosed when ``asyncio.run`` returned): waiting for it, from any thread, would block for
    ever. It is refused as waiting in the loop's own thread is."""
    loop = asyncio.new_event_loop()
    outcome = BatchOutcome("t", 0, loop)
    loop.close()
    _, raised = _in_a_new_thread(lambda: outcome.wait(2.0))  # before: False after 2 s
    assert isinstance(raised[0], asyncio.InvalidStateError), raised
