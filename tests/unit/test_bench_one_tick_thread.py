"""The one-thread arm's poll view of tests/bench/bench_one_tick_thread.py: each pysyncobj object's
descriptors go to its node's one poll, a descriptor that fires marks its own object due and no
other, and the object's own ``poll`` records its sleep instead of waiting."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest
from bench_scripts import loaded_bench
from pysyncobj.poller import POLL_EVENT_TYPE, PollPoller


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    yield from loaded_bench("bench_one_tick_thread")


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    made = [os.pipe(), os.pipe()]
    yield made
    for r, w in made:
        os.close(r)
        os.close(w)


def test_a_descriptor_that_fires_marks_its_own_object_due_and_runs_its_callback(
    bench: ModuleType, pipes: list[tuple[int, int]]
) -> None:
    shared = PollPoller()
    views = [bench._GroupPoller(shared), bench._GroupPoller(shared)]
    fired: list[int] = []
    for view, (r, _) in zip(views, pipes, strict=True):
        view.subscribe(r, lambda descr, _event: fired.append(descr), POLL_EVENT_TYPE.READ)
    os.write(pipes[1][1], b"x")
    shared.poll(0)
    assert fired == [pipes[1][0]]
    assert [view.due for view in views] == [False, True]


def test_an_objects_own_poll_records_its_sleep_and_reads_nothing(
    bench: ModuleType, pipes: list[tuple[int, int]]
) -> None:
    shared = PollPoller()
    view = bench._GroupPoller(shared)
    fired: list[int] = []
    view.subscribe(pipes[0][0], lambda descr, _event: fired.append(descr), POLL_EVENT_TYPE.READ)
    os.write(pipes[0][1], b"x")
    view.poll(0.25)
    assert (view.wait_s, fired, view.due) == (0.25, [], False)
    view.unsubscribe(pipes[0][0])
    shared.poll(0)
    assert fired == []
