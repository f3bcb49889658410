"""The power-loss model (chaos/lossy_disk.py) on its own: after a power loss exactly what was fsynced
is left, file data and directory entries alike. The same model under FUSE, with RocksDB on it:
tests/integration/test_powerloss_fs.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftmq.chaos.lossy_disk import DiskCut, LossyDisk

W = os.O_WRONLY | os.O_CREAT


@pytest.fixture
def disk(tmp_path: Path) -> LossyDisk:
    (tmp_path / "data").mkdir()
    return LossyDisk(str(tmp_path / "data"), str(tmp_path / "trash"))


def write(disk: LossyDisk, path: str, data: bytes, offset: int = 0, sync: bool = False) -> None:
    fd = disk.open(path, W)
    disk.write(fd, data, offset)
    if sync:
        disk.fsync(fd)
    disk.close(fd)


def tree(disk: LossyDisk) -> dict[str, bytes | None]:
    """Every path under the data directory: file contents, None for directories."""
    out: dict[str, bytes | None] = {}
    for parent, dirs, files in os.walk(disk.data):
        rel = os.path.relpath(parent, disk.data)
        for d in dirs:
            out[os.path.normpath(os.path.join(rel, d))] = None
        for f in files:
            out[os.path.normpath(os.path.join(rel, f))] = Path(parent, f).read_bytes()
    return out


def test_unsynced_appends_are_lost_and_synced_ones_kept(disk: LossyDisk) -> None:
    write(disk, "/log", b"one", sync=True)
    disk.fsync_dir("/")
    write(disk, "/log", b"two", offset=3, sync=True)
    write(disk, "/log", b"three", offset=6)
    report = disk.power_loss()
    assert tree(disk) == {"log": b"onetwo"}
    assert report.unsynced_bytes == 5 and report.files_reverted == 1


def test_overwrites_inside_the_durable_size_come_back(disk: LossyDisk) -> None:
    write(disk, "/f", b"abcdefgh", sync=True)
    disk.fsync_dir("/")
    write(disk, "/f", b"XY", offset=2)
    write(disk, "/f", b"Z", offset=3)  # twice over one byte: the first before-image wins
    write(disk, "/f", b"tail", offset=8)
    disk.power_loss()
    assert tree(disk) == {"f": b"abcdefgh"}


def test_truncates_are_undone_down_and_up(disk: LossyDisk) -> None:
    write(disk, "/f", b"0123456789", sync=True)
    disk.fsync_dir("/")
    disk.truncate("/f", 4)
    write(disk, "/f", b"new", offset=6)  # a hole, then new bytes
    disk.truncate("/f", 2)
    disk.power_loss()
    assert tree(disk) == {"f": b"0123456789"}


def test_a_synced_truncate_is_kept(disk: LossyDisk) -> None:
    write(disk, "/f", b"0123456789", sync=True)
    disk.fsync_dir("/")
    disk.truncate("/f", 4)
    fd = disk.open("/f", os.O_WRONLY)
    disk.fsync(fd)
    disk.close(fd)
    disk.power_loss()
    assert tree(disk) == {"f": b"0123"}


def test_o_trunc_open_is_undone(disk: LossyDisk) -> None:
    write(disk, "/f", b"old", sync=True)
    disk.fsync_dir("/")
    fd = disk.open("/f", os.O_WRONLY | os.O_TRUNC)
    disk.write(fd, b"n", 0)
    disk.close(fd)
    disk.power_loss()
    assert tree(disk) == {"f": b"old"}


def test_o_sync_writes_are_durable(disk: LossyDisk) -> None:
    write(disk, "/f", b"", sync=True)
    disk.fsync_dir("/")
    fd = disk.open("/f", os.O_WRONLY | os.O_DSYNC)
    disk.write(fd, b"synchronous", 0)
    disk.close(fd)
    disk.power_loss()
    assert tree(disk) == {"f": b"synchronous"}


def test_a_synced_file_in_an_unsynced_directory_is_lost(disk: LossyDisk) -> None:
    write(disk, "/new", b"data", sync=True)
    disk.power_loss()
    assert tree(disk) == {}


def test_a_file_whose_entry_was_synced_but_data_not_is_empty(disk: LossyDisk) -> None:
    write(disk, "/new", b"data")
    disk.fsync_dir("/")
    disk.power_loss()
    assert tree(disk) == {"new": b""}


def test_unsynced_unlink_comes_back_with_its_data(disk: LossyDisk) -> None:
    write(disk, "/keep", b"durable", sync=True)
    disk.fsync_dir("/")
    disk.unlink("/keep")
    assert tree(disk) == {}
    disk.power_loss()
    assert tree(disk) == {"keep": b"durable"}


def test_synced_unlink_stays_done_and_its_trash_is_freed(disk: LossyDisk) -> None:
    write(disk, "/gone", b"x", sync=True)
    disk.fsync_dir("/")
    disk.unlink("/gone")
    disk.fsync_dir("/")
    assert os.listdir(disk.trash) == []
    disk.power_loss()
    assert tree(disk) == {}


def test_the_rename_over_pattern_keeps_the_old_file_until_the_directory_is_synced(disk: LossyDisk) -> None:
    """RocksDB's CURRENT, our placement cache: write a temp file, fsync it, rename it over the real
    one. Without the directory's fsync the old name and content come back."""
    write(disk, "/CURRENT", b"MANIFEST-1", sync=True)
    disk.fsync_dir("/")
    write(disk, "/CURRENT.tmp", b"MANIFEST-2", sync=True)
    disk.rename("/CURRENT.tmp", "/CURRENT")
    assert tree(disk) == {"CURRENT": b"MANIFEST-2"}
    disk.power_loss()
    assert tree(disk) == {"CURRENT": b"MANIFEST-1"}


def test_the_rename_over_pattern_with_the_directory_synced_is_durable(disk: LossyDisk) -> None:
    write(disk, "/CURRENT", b"MANIFEST-1", sync=True)
    disk.fsync_dir("/")
    write(disk, "/CURRENT.tmp", b"MANIFEST-2", sync=True)
    disk.rename("/CURRENT.tmp", "/CURRENT")
    disk.fsync_dir("/")
    disk.power_loss()
    assert tree(disk) == {"CURRENT": b"MANIFEST-2"}


def test_a_rename_between_directories_needs_both_synced(disk: LossyDisk) -> None:
    disk.mkdir("/a", 0o755)
    disk.mkdir("/b", 0o755)
    disk.fsync_dir("/")
    write(disk, "/a/f", b"content", sync=True)
    disk.fsync_dir("/a")
    disk.rename("/a/f", "/b/f")
    disk.fsync_dir("/b")  # the new entry is durable, the old one's removal is not
    disk.power_loss()
    assert tree(disk) == {"a": None, "b": None, "a/f": b"content", "b/f": b"content"}


def test_new_directories_and_their_files_go_unless_synced_up_the_tree(disk: LossyDisk) -> None:
    disk.mkdir("/snap", 0o755)
    write(disk, "/snap/file", b"x", sync=True)
    disk.fsync_dir("/snap")
    disk.mkdir("/other", 0o755)
    disk.fsync_dir("/")  # both directories durable; /other's contents never changed
    disk.mkdir("/lost", 0o755)
    disk.power_loss()
    assert tree(disk) == {"snap": None, "snap/file": b"x", "other": None}


def test_rmdir_and_renamed_directories_come_back(disk: LossyDisk) -> None:
    disk.mkdir("/d", 0o755)
    disk.mkdir("/e", 0o755)
    write(disk, "/d/f", b"in d", sync=True)
    disk.fsync_dir("/d")
    disk.fsync_dir("/")
    disk.rmdir("/e")
    disk.rename("/d", "/moved")
    disk.power_loss()
    assert tree(disk) == {"d": None, "d/f": b"in d", "e": None}


def test_hard_links_of_a_checkpoint_follow_their_directory(disk: LossyDisk) -> None:
    """A RocksDB checkpoint hard-links the SST files into a new directory."""
    write(disk, "/db.sst", b"table", sync=True)
    disk.fsync_dir("/")
    disk.mkdir("/ckpt", 0o755)
    disk.link("/ckpt/db.sst", "/db.sst")
    disk.fsync_dir("/ckpt")
    disk.fsync_dir("/")
    disk.unlink("/db.sst")  # the original goes, unsynced: it comes back, the link stays
    disk.power_loss()
    assert tree(disk) == {"db.sst": b"table", "ckpt": None, "ckpt/db.sst": b"table"}


def test_symlinks_are_entries_like_any_other(disk: LossyDisk) -> None:
    disk.symlink("/current", "target-1")
    disk.fsync_dir("/")
    disk.unlink("/current")
    disk.symlink("/current", "target-2")
    disk.power_loss()
    assert os.readlink(os.path.join(disk.data, "current")) == "target-1"


def test_after_the_cut_every_operation_fails(disk: LossyDisk) -> None:
    write(disk, "/f", b"x", sync=True)
    disk.power_loss()
    with pytest.raises(DiskCut):
        disk.open("/f", os.O_RDONLY)
    with pytest.raises(DiskCut):
        disk.mkdir("/d", 0o755)


def test_pending_counts_what_would_be_dropped(disk: LossyDisk) -> None:
    write(disk, "/f", b"12345")
    disk.mkdir("/d", 0o755)
    assert disk.pending() == {"unsynced_bytes": 5, "dirty_files": 1, "dirty_dirs": 1}
    fd = disk.open("/f", os.O_WRONLY)
    disk.fsync(fd)
    disk.close(fd)
    disk.fsync_dir("/")
    assert disk.pending() == {"unsynced_bytes": 0, "dirty_files": 0, "dirty_dirs": 0}


def test_a_rocksdb_like_wal_cycle_loses_only_the_unsynced_tail(disk: LossyDisk) -> None:
    """New WAL created and its directory synced, records appended with a sync every other one, the
    old WAL deleted without a directory sync, a new SST written and its directory synced."""
    write(disk, "/000001.log", b"old-wal", sync=True)
    disk.fsync_dir("/")
    fd = disk.open("/000002.log", W)
    disk.fsync_dir("/")
    offset = 0
    for i in range(6):
        record = f"rec{i};".encode()
        disk.write(fd, record, offset)
        offset += len(record)
        if i % 2 == 1:
            disk.fsync(fd)
    disk.close(fd)
    disk.unlink("/000001.log")
    write(disk, "/000003.sst", b"sorted", sync=True)
    disk.fsync_dir("/")  # makes the unlink durable too
    write(disk, "/000002.log", b"rec6;", offset=offset)
    disk.power_loss()
    assert tree(disk) == {"000002.log": b"rec0;rec1;rec2;rec3;rec4;rec5;", "000003.sst": b"sorted"}


def test_an_unlinked_file_no_durable_directory_names_is_freed_at_once(disk: LossyDisk) -> None:
    """The disk-full nemesis fills the volume with a file and removes it: the space must come back."""
    write(disk, "/filler", b"x" * 4096)
    disk.unlink("/filler")
    assert os.listdir(disk.trash) == []
    assert disk.pending()["dirty_files"] == 0


def test_a_new_directory_tree_with_recorded_directories_inside_goes_whole(disk: LossyDisk) -> None:
    """A node's first start: its directories and a database in them, only the innermost synced."""
    disk.mkdir("/node", 0o755)
    disk.mkdir("/node/db", 0o755)
    write(disk, "/node/db/CURRENT", b"x", sync=True)
    disk.fsync_dir("/node/db")
    write(disk, "/keep", b"k", sync=True)
    disk.fsync_dir("/")  # /node's entry is durable, /node/db's is not
    disk.mkdir("/later", 0o755)
    disk.mkdir("/later/db", 0o755)
    write(disk, "/later/db/f", b"y")
    disk.power_loss()
    assert tree(disk) == {"keep": b"k", "node": None}
