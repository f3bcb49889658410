"""The power-loss file system under FUSE with RocksDB on it (raftmq's own store, the nodes' journal
and state machines): a process writes some batches synced and some not and is killed with SIGKILL.

- a kill alone (the page cache survives) keeps every write, synced or not;
- a kill and a power loss keeps every synced write and drops the unsynced ones, and RocksDB opens
  again on what is left.

Needs root, /dev/fuse and fusermount3 (scripts/chaos installs fuse3), no docker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.chaos.powerloss_fs import LossyMount
from raftmq.storage.rocks import RocksStore

WRITER = textwrap.dedent(
    """
    import sys, time
    from raftmq.storage.rocks import RocksStore
    from raftmq.storage.store import Batch
    store = RocksStore.open(sys.argv[1])
    for i in range(200):
        b = Batch()
        b.put(b"synced-%04d" % i, b"v" * 100)
        store.write(b, sync=True)
    for i in range(200):
        b = Batch()
        b.put(b"unsynced-%04d" % i, b"v" * 100)
        store.write(b, sync=False)
    print("written", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[LossyMount]:
    if os.geteuid() != 0 or shutil.which("fusermount3") is None or not os.path.exists("/dev/fuse"):
        pytest.fail("needs root, /dev/fuse and fusermount3: run scripts/chaos, which installs fuse3")
    m = LossyMount(tmp_path / "disk", tmp_path / "mnt")
    m.mount()
    yield m
    m.unmount()


def write_and_kill(db: Path) -> None:
    # The database's directory durable first: what RocksDB does inside it is under test here.
    db.mkdir()
    fd = os.open(db.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "written"
    writer.send_signal(signal.SIGKILL)
    writer.wait()


def keys(db: Path) -> tuple[int, int]:
    store = RocksStore.open(str(db))
    try:
        synced = sum(1 for _ in store.scan(b"synced-", b"synced."))
        unsynced = sum(1 for _ in store.scan(b"unsynced-", b"unsynced."))
    finally:
        store.close()
    return synced, unsynced


def test_a_kill_alone_keeps_unsynced_rocksdb_writes(mount: LossyMount) -> None:
    db = mount.mountpoint / "db"
    write_and_kill(db)
    pending = mount.pending()
    assert pending["unsynced_bytes"] > 0, pending
    assert keys(db) == (200, 200)


def test_a_power_loss_drops_exactly_the_unsynced_rocksdb_writes(mount: LossyMount) -> None:
    db = mount.mountpoint / "db"
    write_and_kill(db)
    report = mount.power_loss()
    assert report["unsynced_bytes"] > 200 * 100, report
    assert not mount.mounted()
    mount.mount()
    assert keys(db) == (200, 0)
    # And the store keeps working on the new mount: another power loss right after opening is harmless.
    mount.power_loss()
    mount.mount()
    assert keys(db) == (200, 0)


def test_a_database_created_in_new_directories_survives_a_power_loss(mount: LossyMount) -> None:
    """A node's first start creates its directories and databases: RocksDB fsyncs its files and
    its own directory, not the entries above it; RocksStore.open makes them durable."""
    db = mount.mountpoint / "node" / "groups" / "g0" / "db"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "written"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    mount.power_loss()
    mount.mount()
    assert keys(db) == (200, 0)
