"""``base/tar_stream.tar_chunks``: the archive a checkpoint is sent as, made chunk by chunk, is a tar
that ``tarfile`` and ``safe_extract`` read back to the same files; and a checkpoint of a real
RocksDB store sent that way passes the checks of a snapshot install."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import orjson
import pytest

from raftmq.cluster.base.safe_tar import safe_extract
from raftmq.cluster.base.tar_stream import tar_chunks
from raftmq.cluster.node import checkpoints
from raftmq.storage.keys import APPLIED, encode_u64
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

SIZES = [0, 1, 511, 512, 513, 4096, 10_000, 70_000]


def _tree(root: Path) -> dict[str, bytes]:
    files = {}
    for i, size in enumerate(SIZES):
        sub = root / ("deep/er" if i % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        (sub / f"f{i}.bin").write_bytes(data)
        files[str((sub / f"f{i}.bin").relative_to(root))] = data
    (root / "empty-dir").mkdir()
    return files


@pytest.mark.parametrize("chunk_bytes", [100, 512, 4096, 1 << 20])
def test_the_archive_reads_back_to_the_same_files_whatever_the_chunk_size(
    tmp_path: Path, chunk_bytes: int
) -> None:
    files = _tree(tmp_path / "src")
    (tmp_path / "meta.json").write_bytes(b'{"a": 1}')
    chunks = list(
        tar_chunks(
            [(str(tmp_path / "src"), "checkpoint"), (str(tmp_path / "meta.json"), "meta.json")], chunk_bytes
        )
    )
    archive = b"".join(chunks)
    assert len(archive) % tarfile.RECORDSIZE == 0
    # Every chunk but the last is about chunk_bytes: a file's bytes are not held back whole.
    assert all(chunk_bytes <= len(c) < 2 * chunk_bytes + 2048 for c in chunks[:-1])
    assert len(chunks) > 1 or chunk_bytes > len(archive)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tar:  # a stream: one pass, in order
        names = [m.name for m in tar]
    assert names[0] == "checkpoint" and names[-1] == "meta.json"
    dest = tmp_path / "out"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        safe_extract(tar, str(dest))
    for name, data in files.items():
        assert (dest / "checkpoint" / name).read_bytes() == data
    assert (dest / "checkpoint" / "empty-dir").is_dir()
    assert (dest / "meta.json").read_bytes() == b'{"a": 1}'


def test_a_file_that_changes_size_while_archived_fails_the_archive(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x" * 3000)
    (src / "b").write_bytes(b"y" * 10)
    chunks = tar_chunks([(str(src), "d")], chunk_bytes=1000)
    next(chunks)  # a's header and first bytes: its size (3000) is fixed now
    with open(src / "a", "ab") as f:
        f.write(b"more")
    with pytest.raises(OSError, match="grew past its size"):
        list(chunks)


def _checkpoint(tmp_path: Path, applied: int, keys: int, value_bytes: int) -> str:
    """A checkpoint of a real store applied to ``applied``, and its ``meta.json``, as
    ``Checkpoints.open_stream`` leaves them for the archive."""
    store = RocksStore.open(str(tmp_path / "state"))
    batch = Batch()
    batch.put(APPLIED, encode_u64(applied))
    for i in range(keys):
        batch.put(b"k%06d" % i, os.urandom(value_bytes))
    store.write(batch, sync=True)
    ckpt = str(tmp_path / "tmp" / "ckpt-0-1")
    store.checkpoint(ckpt)
    store.close()
    meta = {"group": "0", "node_id": "n1", "applied_index": applied}
    Path(ckpt + ".json").write_bytes(orjson.dumps(meta))
    return ckpt


def test_a_checkpoint_sent_as_a_stream_passes_the_install_checks(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, applied=77, keys=2000, value_bytes=100)
    stream = checkpoints.CheckpointStream(ckpt)
    try:
        archive = b"".join(stream.chunks())
    finally:
        stream.close()
    assert not os.path.exists(ckpt) and not os.path.exists(ckpt + ".json")  # close deletes it
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tar:
        names = [m.name for m in tar]
    assert names[-1] == "meta.json"  # last: a download cut before it is refused by the check
    dest = tmp_path / "incoming"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        safe_extract(tar, str(dest))
    assert checkpoints._check_checkpoint("0", str(dest), need=70) == 77


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, "before-meta"])
def test_an_archive_cut_short_never_passes_as_a_checkpoint(tmp_path: Path, keep: float | str) -> None:
    """A download that ends early (a peer that died mid-send) is read as a stream: either the read
    fails and nothing stays extracted, or what was extracted lacks ``meta.json`` (the archive's last
    member) and the install's check refuses it."""
    ckpt = _checkpoint(tmp_path, applied=5, keys=500, value_bytes=200)
    archive = b"".join(checkpoints.CheckpointStream(ckpt).chunks())
    if keep == "before-meta":  # every file of the checkpoint whole, the last member missing
        with tarfile.open(fileobj=io.BytesIO(archive)) as whole:
            offset = whole.getmember("meta.json").offset
        assert offset > 0
        with tarfile.open(fileobj=io.BytesIO(archive[:offset]), mode="r|") as tar:
            checkpoints._safe_extract(tar, str(tmp_path / "incoming"))
        with pytest.raises(FileNotFoundError):
            checkpoints._check_checkpoint("0", str(tmp_path / "incoming"), need=1)
        return
    else:  # at a block boundary: a member's data cut, or a member boundary
        cut = archive[: int(len(archive) * float(keep)) // 512 * 512]
    dest = tmp_path / "incoming"
    try:
        with tarfile.open(fileobj=io.BytesIO(cut), mode="r|") as tar:
            checkpoints._safe_extract(tar, str(dest))
    except tarfile.TarError:
        assert not dest.exists()
        return
    with pytest.raises(FileNotFoundError):
        checkpoints._check_checkpoint("0", str(dest), need=1)


def test_a_link_or_anything_but_files_and_directories_is_not_archived(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x")
    (src / "b").symlink_to(src / "a")
    with pytest.raises(OSError, match="neither a regular file nor a directory"):
        list(tar_chunks([(str(src), "d")]))


def test_a_file_that_shrinks_while_archived_fails_the_archive(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"x" * 50_000)  # past what a buffered read takes ahead (8 KiB)
    chunks = tar_chunks([(str(src), "d")], chunk_bytes=1000)
    next(chunks)
    with open(src / "a", "r+b") as f:
        f.truncate(1500)
    with pytest.raises(OSError, match="ended"):
        list(chunks)


def test_long_and_non_ascii_names_read_back(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    long_name = "n" * 150 + "-é.bin"
    (src / long_name).write_bytes(b"data")
    archive = b"".join(tar_chunks([(str(src), "d")]))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.extractfile(f"d/{long_name}").read() == b"data"  # type: ignore[union-attr]
