"""LoopCalls: calls from other threads run on the loop exactly once, in order, with one wake-up
for all the calls made while one is pending (cluster/base/loop_calls.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from raftmq.cluster.base.loop_calls import LoopCalls


def test_calls_made_while_the_loop_is_busy_run_in_order_after_one_wake_up() -> None:
    async def main() -> tuple[list[int], int]:
        calls = LoopCalls(asyncio.get_running_loop())
        out: list[int] = []
        thread = threading.Thread(target=lambda: [calls.call(out.append, i) for i in range(1000)])
        thread.start()
        thread.join()  # the loop thread is blocked here: every call waits for one run
        assert out == []
        await asyncio.sleep(0)
        return out, calls.wakeups

    out, wakeups = asyncio.run(main())
    assert out == list(range(1000)) and wakeups == 1


def test_calls_from_racing_threads_each_run_once_in_each_thread_s_order() -> None:
    n = 20_000

    async def main() -> tuple[list[tuple[int, int]], int]:
        calls = LoopCalls(asyncio.get_running_loop())
        out: list[tuple[int, int]] = []
        done = asyncio.Event()
        finished = [0]

        def finish() -> None:  # each thread's last call: everything it called before has run
            finished[0] += 1
            if finished[0] == 2:
                done.set()

        def make(t: int) -> None:
            for i in range(n):
                calls.call(out.append, (t, i))
            calls.call(finish)

        threads = [threading.Thread(target=make, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        await done.wait()  # the loop runs calls while the threads make them
        for th in threads:
            th.join()
        await asyncio.sleep(0)
        return out, calls.wakeups

    out, wakeups = asyncio.run(asyncio.wait_for(main(), 30))
    assert len(out) == 2 * n
    for t in range(2):
        assert [i for u, i in out if u == t] == list(range(n))
    assert 1 <= wakeups < 2 * n  # fewer wake-ups than calls


def test_a_failing_call_is_reported_and_the_calls_after_it_still_run() -> None:
    async def main() -> tuple[list[int], list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: reported.append(context))
        calls = LoopCalls(loop)
        out: list[int] = []
        calls.call(out.append, 1)
        calls.call(lambda: 1 / 0)
        calls.call(out.append, 2)
        await asyncio.sleep(0)
        return out, reported

    out, reported = asyncio.run(main())
    assert out == [1, 2]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ZeroDivisionError)
