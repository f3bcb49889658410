"""Failure paths found by the chaos suite: journal storage failures, old tarfile, noisy pysyncobj."""

from __future__ import annotations

import io
import logging
import tarfile
from pathlib import Path
from typing import Any

import pytest

from raftmq.cluster.node import checkpoints as checkpoints_module
from raftmq.cluster.replication import log_filter
from raftmq.cluster.replication.journal import DurableJournal
from raftmq.storage.memory import MemoryStore
from raftmq.storage.store import Batch, StoreError


class _FullDisk(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.full = False

    def write(self, batch: Batch, *, sync: bool = False) -> None:
        if self.full:
            raise StoreError("No space left on device")
        super().write(batch, sync=sync)


def test_a_failing_journal_write_reports_the_storage_failure_instead_of_retrying() -> None:
    store = _FullDisk()
    journal = DurableJournal(store)
    journal.add(b"x", 1, 1)
    failures: list[StoreError] = []
    journal.on_storage_failure = failures.append
    store.full = True
    with pytest.raises(StoreError):
        journal.add(b"y", 2, 1)
    assert [str(e) for e in failures] == ["No space left on device"]
    assert len(journal) == 1  # the entry that could not be written is not in the log


def test_pysyncobj_truncation_alarm_is_filtered_and_other_messages_pass() -> None:
    log_filter.install_log_filter()
    log_filter.install_log_filter()  # idempotent
    logger = logging.getLogger("pysyncobj.syncobj")
    assert sum(isinstance(f, log_filter.MatchingTruncationFilter) for f in logger.filters) == 1
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logger.critical("truncating already-applied log entries from index %d (last applied: %d)", 5, 7)
        logger.critical("failed to load full dump")
    finally:
        logger.removeHandler(handler)
    assert seen == ["failed to load full dump"]


def _tar_with(members: list[tuple[tarfile.TarInfo, bytes]]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


@pytest.mark.parametrize("has_data_filter", [True, False])
def test_checkpoint_extraction_refuses_escaping_paths_and_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_data_filter: bool
) -> None:
    if not has_data_filter:  # Debian bookworm's Python 3.11.2 has no tarfile.data_filter
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good = tarfile.TarInfo("checkpoint/CURRENT")
    good.size = 3
    checkpoints_module._safe_extract(_tar_with([(good, b"abc")]), str(tmp_path / "ok"))
    assert (tmp_path / "ok" / "checkpoint" / "CURRENT").read_bytes() == b"abc"

    escape = tarfile.TarInfo("../outside")
    escape.size = 1
    link = tarfile.TarInfo("checkpoint/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    for bad in (escape, link):
        data: Any = b"x" if bad.isfile() else b""
        with pytest.raises((ValueError, tarfile.TarError)):
            checkpoints_module._safe_extract(_tar_with([(bad, data)]), str(tmp_path / "bad"))
    assert not (tmp_path / "outside").exists()


def test_a_peer_that_cannot_be_connected_to_is_a_definite_retriable_failure() -> None:
    """A connect timeout (a cut-off leader) sent nothing: it must be `unavailable` (definite), so
    `group_call` retries at the next leader, not `unknown_outcome`."""
    import asyncio
    from types import SimpleNamespace

    import aiohttp

    from raftmq.cluster.base import errors
    from raftmq.cluster.base.errors import RaftmqError
    from raftmq.cluster.config.cluster_file import Limits, RaftTimingConfig
    from raftmq.cluster.node.router import LeaderRouter

    leader = SimpleNamespace(id="n2")

    async def peer_request(*args: Any, **kwargs: Any) -> Any:
        raise aiohttp.ConnectionTimeoutError("connect timed out")

    fake_node = SimpleNamespace(
        config=SimpleNamespace(limits=Limits(), raft=RaftTimingConfig()),
        groups={},
        me=SimpleNamespace(id="n1"),
        leader_of=lambda name: leader,
        peer_request=peer_request,
    )
    router = LeaderRouter(fake_node)  # type: ignore[arg-type]
    with pytest.raises(RaftmqError) as e:
        asyncio.run(router._group_call_once("0", "produce", {"batches": []}, None))
    assert e.value.error is errors.UNAVAILABLE and e.value.definite
