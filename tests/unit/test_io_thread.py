"""The sync clients' I/O thread: a call racing the client's close from another thread ends (the
client is closed) instead of waiting forever on a coroutine the stopped loop never ran."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from raftmq.client._io_thread import LoopThread, SyncClient
from raftmq.client.errors import ClientClosed


def _call_until_closed(io: LoopThread, started: threading.Event, ended: list[str]) -> None:
    started.set()
    while True:
        try:
            io.run(asyncio.sleep(0))
        except ClientClosed:
            ended.append("closed")
            return
        except concurrent.futures.CancelledError:
            ended.append("cancelled")
            return


def test_calls_racing_stop_return() -> None:
    for attempt in range(300):
        io = LoopThread(f"race-{attempt}")
        started = threading.Event()
        ended: list[str] = []
        caller = threading.Thread(target=_call_until_closed, args=(io, started, ended), daemon=True)
        caller.start()
        started.wait()
        io.stop()
        caller.join(5)
        assert ended, f"attempt {attempt}: a call racing stop() never returned"


def test_a_call_after_stop_is_refused() -> None:
    io = LoopThread("after-stop")
    io.stop()
    with pytest.raises(ClientClosed):
        io.run(asyncio.sleep(0))


def _raising_into(
    errors: list[BaseException], call: Callable[[Coroutine[Any, Any, None]], object], sleep_s: float
) -> Callable[[], None]:
    """A thread's target that hands ``call`` a coroutine sleeping ``sleep_s`` (made in that
    thread) and keeps what it raises in ``errors``."""

    def target() -> None:
        try:
            call(asyncio.sleep(sleep_s))
        except BaseException as error:
            errors.append(error)

    return target


def test_two_threads_closing_a_client_at_once_both_return() -> None:
    for attempt in range(100):
        io = LoopThread(f"close-{attempt}")
        client = SyncClient.__new__(SyncClient)
        client._io = io
        failures: list[BaseException] = []
        close = _raising_into(failures, client._shut_down, 0.001)
        closers = [threading.Thread(target=close, daemon=True) for _ in range(2)]
        for t in closers:
            t.start()
        for t in closers:
            t.join(5)
        assert not any(t.is_alive() for t in closers), f"attempt {attempt}: a close never returned"
        assert failures == [], f"attempt {attempt}: {failures!r}"


def test_a_call_from_a_thread_started_after_the_io_thread_ended_is_refused_as_closed() -> None:
    """A thread started once the I/O thread has ended often gets its identifier (the OS reuses it:
    40 times in 50 here). Such a call was refused as one from the I/O thread itself (a
    RuntimeError meant for a delivery callback), not as a call on a closed client; so was, once
    under load, the second of two closes at once (the test above) started after the first ended."""
    for attempt in range(20):
        io = LoopThread(f"ended-{attempt}")
        io.stop()
        errors: list[BaseException] = []
        caller = threading.Thread(target=_raising_into(errors, io.run, 0))
        caller.start()
        caller.join(5)
        assert [type(e) for e in errors] == [ClientClosed], f"attempt {attempt}: {errors!r}"
