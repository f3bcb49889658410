"""What bench_backlog.py says a node spent (tests/bench/backlog/usage.py): CPU seconds that never
go negative when a thread ends between two readings (a backlog run's catch-up once showed a node
at -4.02 s: the sum over live threads lost a checkpoint download's thread that had ended).

A real process with a real thread that burns CPU and ends."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]

# A thread burns CPU, says so, burns on until told to stop, and ends; the main thread only waits.
BURNER = """
import sys, threading, time
stop = threading.Event()
def burn():
    spent = time.thread_time()
    while time.thread_time() - spent < 0.4:
        pass
    print("burnt", flush=True)
    while not stop.is_set():
        pass
worker = threading.Thread(target=burn)
worker.start()
sys.stdin.readline()
stop.set()
worker.join()
print("ended", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def usage() -> Iterator[ModuleType]:
    """tests/bench/backlog/usage.py as a module; the repository's entry on the import path (whose
    docker/ folder would shadow docker-py) and the modules it brought are taken out again."""
    path, modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(REPO))
    try:
        yield importlib.import_module("tests.bench.backlog.usage")
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if name == "tests" or name.startswith("tests."):
                sys.modules.pop(name, None)


@pytest.fixture
def burner() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    proc.kill()
    proc.wait()


def test_a_thread_that_ended_between_two_readings_keeps_its_cpu(
    usage: ModuleType, burner: subprocess.Popen[str]
) -> None:
    assert burner.stdin is not None and burner.stdout is not None
    assert burner.stdout.readline().strip() == "burnt"
    before = usage.process_usage(burner.pid)
    assert before["cpu_s"] >= 0.3  # the thread's 0.4 s, give or take a tick
    burner.stdin.write("stop\n")
    burner.stdin.flush()
    assert burner.stdout.readline().strip() == "ended"
    after = usage.process_usage(burner.pid)
    # the thread spun a little more before it saw the stop: never less than before
    assert after["cpu_s"] >= before["cpu_s"]


def test_rocksdb_threads_are_compared_thread_by_thread(usage: ModuleType) -> None:
    before = {1: 2.0, 2: 5.0}
    after = {1: 2.5, 3: 0.25}  # 2 ended (its 5 s are not taken away), 3 started meanwhile
    assert usage.rocksdb_cpu_delta(before, after) == 0.75
