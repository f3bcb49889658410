"""Production load: thousands of messages a second through the client's batch path, every outcome
in the history.

``LoadConfig.producers`` producers, each the client's idempotent :class:`~raftmq.client.AsyncProducer`
with every node as a bootstrap address and its default wire (binary batches,
``application/vnd.raftmq.batch``), a linger of a few milliseconds, so that its batches hold many
messages. Together they offer ``rate`` messages a second, paced in ticks of ``tick_ms``: each tick
a producer sends what the time since its last tick owes (a tick late because the process waited
for a core is made up, up to ``max_catch_up_s``), half of them keyed (``key_share``: the client
hashes the key to a queue), the rest unkeyed (the client spreads them). Values are unique:
``"L<w>-<seq>"``. The producers run in ``processes`` processes of their own (:class:`LoadProcesses`),
each writing its own history file, merged into the run's by time at the end.

Each message is an ``enqueue`` operation of the history (``client`` = ``"load"``): its invoke when
it is handed to the producer, its ``ok`` (with the queue and offset the producer was told) or
``fail``/``info`` (the error's ``definite`` flag) when its batch finishes, from the producer's
done callback. The messages of one producer are in flight together, so each is its own process (a
Jepsen process does one operation at a time: the availability checker pairs an invoke with the
next completion of its process); the queue-order checker's per-process order is therefore not
asked of the load, only of the workload's one-at-a-time producers.

A producer stuck behind a full buffer (its cluster down) waits in ``send``: the offered rate is
what the cluster can take then, and the figures say what was offered and acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from raftmq.client import AsyncProducer, FutureRecord, RaftmqError

from .client import advertised_url
from .history import INVOKE, History, HistoryFile

__all__ = ["AddressFile", "LoadConfig", "LoadProcesses", "LoadProducers"]

log = logging.getLogger("raftmq.chaos.load")


@dataclass(frozen=True)
class LoadConfig:
    producers: int = 4
    rate: float = 10_000.0  # messages a second, all producers together
    key_share: float = 0.5
    keys: int = 1000  # distinct keys
    tick_ms: int = 20
    max_catch_up_s: float = 1.0  # a late tick makes up at most this much time's messages
    linger_ms: int = 5
    delivery_timeout_ms: int = 10_000
    request_timeout_ms: int = 3_000
    processes: int = 2  # the producers run in this many processes of their own (LoadProcesses)


class LoadProducers:
    def __init__(
        self,
        history: History,
        nodes: Sequence[str],
        address_map: Callable[[str], str | None],
        topic: str,
        config: LoadConfig,
        seed: int = 0,
    ) -> None:
        self.history = history
        self.nodes = list(nodes)
        self.address_map = address_map
        self.topic = topic
        self.config = config
        self.rng = random.Random(seed)
        self.offered = 0
        self.acknowledged = 0

    async def producer(self, w: int, stop: asyncio.Event) -> None:
        cfg = self.config
        rng = random.Random(self.rng.random())
        bootstrap = [advertised_url(n) for n in self.nodes[w % len(self.nodes) :] + self.nodes]
        producer = AsyncProducer(
            list(dict.fromkeys(bootstrap)),
            linger_ms=cfg.linger_ms,
            request_timeout_ms=cfg.request_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
            address_map=self.address_map,
        )
        per_s = cfg.rate / cfg.producers
        seq = 0
        owed = 0.0
        last = next_at = time.monotonic()
        try:
            while not stop.is_set():
                # Owed by the time that passed, not by the tick: a tick that came late (the process
                # waited for a core) is made up, up to max_catch_up_s (a longer wait, a full buffer
                # while the cluster is down, is not made up in a burst).
                now = time.monotonic()
                owed += per_s * min(now - last, cfg.max_catch_up_s)
                last = now
                while owed >= 1 and not stop.is_set():
                    owed -= 1
                    process = self.history.new_process()
                    value = f"L{w}-{seq}"
                    seq += 1
                    key = f"k{rng.randrange(cfg.keys)}" if rng.random() < cfg.key_share else None
                    self.history.append(type=INVOKE, process=process, f="enqueue", value=value, client="load",
                                        key=key, queue=None)  # fmt: skip
                    self.offered += 1
                    try:
                        handle = await producer.send(self.topic, value, key=key)
                    except RaftmqError as e:
                        self._finished(process, value, key, None, e)
                        continue
                    handle.add_done_callback(functools.partial(self._done, process, value, key))
                next_at += cfg.tick_ms / 1000
                delay = next_at - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                else:
                    next_at = time.monotonic()
                    await asyncio.sleep(0)
        finally:
            await producer.close(timeout_s=cfg.delivery_timeout_ms / 1000 + 2)

    def _done(self, process: int, value: str, key: str | None, handle: FutureRecord) -> None:
        self._finished(process, value, key, handle, None)

    def _finished(
        self,
        process: int,
        value: str,
        key: str | None,
        handle: FutureRecord | None,
        error: RaftmqError | None,
    ) -> None:
        common: dict[str, Any] = {
            "process": process,
            "f": "enqueue",
            "value": value,
            "client": "load",
            "key": key,
        }
        if handle is not None:
            error = handle.exception(0)
        if error is None and handle is not None:
            meta = handle.result(0)
            self.acknowledged += 1
            self.history.append(type="ok", queue=meta.queue, offset=meta.offset, **common)
        else:
            assert error is not None
            kind = "fail" if error.definite else "info"
            self.history.append(type=kind, queue=None, error=error.code, **common)


class AddressFile:
    """The harness's ``address_map`` shared with the load's processes through a small JSON file
    (node -> URL, or null while it is down), which the parent rewrites (atomically) when an address
    changes and a child reads again when its mtime moved, at most every ``recheck_s``. A child may
    use an address up to ``recheck_s`` old: a port that is gone refuses the connection, a definite
    failure the producer retries."""

    def __init__(self, path: Path, recheck_s: float = 0.05) -> None:
        self.path = path
        self.recheck_s = recheck_s
        self._urls: dict[str, str | None] = {}
        self._mtime_ns = -1
        self._checked = 0.0

    def publish(self, urls: dict[str, str | None]) -> None:
        if urls == self._urls:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(urls))
        os.replace(tmp, self.path)
        self._urls = dict(urls)

    def __call__(self, url: str) -> str | None:
        now = time.monotonic()
        if now - self._checked >= self.recheck_s:
            self._checked = now
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                mtime = os.stat(self.path).st_mtime_ns
                if mtime != self._mtime_ns:
                    self._urls = orjson.loads(self.path.read_bytes())
                    self._mtime_ns = mtime
        return self._urls.get(urlsplit(url).hostname or "")


@dataclass(frozen=True)
class _ChildSpec:
    index: int
    workers: tuple[int, ...]  # the load's producer numbers this process runs
    nodes: tuple[str, ...]
    topic: str
    config: LoadConfig
    seed: int
    t0_ns: int
    history_path: Path
    addresses_path: Path


# A child's process ids start here (times its index + 1): apart from the parent's, which count from 1.
PROCESS_ID_BLOCK = 1_000_000_000


def _child_main(spec: _ChildSpec, ready: Any, stop: Any) -> None:
    """A load process: its producers, its own history file (not kept in memory), until ``stop``."""
    logging.basicConfig(level=logging.WARNING)
    ready.set()  # imported: the parent starts the clock

    async def main() -> None:
        first = (spec.index + 1) * PROCESS_ID_BLOCK
        history = History(spec.history_path, t0_ns=spec.t0_ns, first_process=first, keep=False)
        load = LoadProducers(history, spec.nodes, AddressFile(spec.addresses_path), spec.topic, spec.config,
                             seed=spec.seed * 1009 + spec.index)  # fmt: skip
        done = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.05)
            done.set()

        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.gather(*(load.producer(w, done) for w in spec.workers))
        finally:
            watcher.cancel()
            history.close()

    asyncio.run(main())


class LoadProcesses:
    """The production load in ``processes`` processes of its own (the harness's event loop, with
    the workload, the group consumers and the history, is one core at most): ``config.producers``
    producers spread over them, each process with its history file under ``directory``, merged
    into the run's history by :meth:`stop`."""

    def __init__(
        self,
        history: History,
        nodes: Sequence[str],
        address_map: Callable[[str], str | None],
        topic: str,
        config: LoadConfig,
        directory: Path,
        seed: int = 0,
    ) -> None:
        self.history = history
        self.nodes = list(nodes)
        self.address_map = address_map
        self.addresses = AddressFile(directory / "load-addresses.json")
        self.config = config
        self.offered = 0
        self.acknowledged = 0
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._ready: list[Any] = []
        count = max(1, min(config.processes, config.producers))
        self._children = []
        for i in range(count):
            spec = _ChildSpec(
                index=i, workers=tuple(range(i, config.producers, count)), nodes=tuple(nodes), topic=topic,
                config=config, seed=seed, t0_ns=history.t0_ns, history_path=directory / f"load-{i}.jsonl",
                addresses_path=self.addresses.path,
            )  # fmt: skip
            ready = context.Event()
            self._ready.append(ready)
            process = context.Process(target=_child_main, args=(spec, ready, self._stop), daemon=True)
            self._children.append((spec, process))

    def _publish(self) -> None:
        self.addresses.publish({n: self.address_map(advertised_url(n)) for n in self.nodes})

    async def start(self, timeout_s: float = 60) -> None:
        """Start the processes and wait until each has imported what it needs (a second or two on
        a busy machine), so that the load runs for the whole time limit."""
        self._publish()
        for _, process in self._children:
            process.start()
        for ready in self._ready:
            if not await asyncio.to_thread(ready.wait, timeout_s):
                raise RuntimeError("a load process did not start")

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the processes' addresses current until ``stop``, stop them and merge their histories."""
        try:
            while not stop.is_set():
                self._publish()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
            self._stop.set()
            deadline = time.monotonic() + self.config.delivery_timeout_ms / 1000 + 20
            while any(p.is_alive() for _, p in self._children) and time.monotonic() < deadline:
                self._publish()  # the producers' last batches still need addresses
                await asyncio.sleep(0.05)
        finally:
            self._stop.set()
            for _, process in self._children:
                if process.is_alive():
                    log.warning("load process %s did not stop: killed", process.pid)
                    process.kill()
                await asyncio.to_thread(process.join, 5)
        await asyncio.to_thread(self._merge)

    def _merge(self) -> None:
        """Count the children's outcomes and merge their files into the run's history, one
        operation at a time (a soak's load writes tens of millions)."""
        paths = [spec.history_path for spec, _ in self._children if spec.history_path.exists()]
        for path in paths:
            for op in HistoryFile(path):
                if op["type"] == INVOKE:
                    self.offered += 1
                elif op["type"] == "ok":
                    self.acknowledged += 1
        self.history.merge_files(paths)
        for path in paths:
            path.unlink()  # merged into the run's history: not kept twice
