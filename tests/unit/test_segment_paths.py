"""Segment file paths never leave the segment store's root (``storage/segments.py``, ``locate``).

Every file operation of :class:`SegmentStore` takes a path relative to the root, which arrives in
replicated seal commands and is built from names and ids: ``..``, absolute paths, odd characters
and symlinks out of the root are refused, and the file outside is left untouched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from raftmq.cluster.node.sealer import locate
from raftmq.storage.columns import empty_batch
from raftmq.storage.segments import SegmentStore, UnsafePath, checked_rel

BAD = [
    "../outside.arrow",
    "arrow/../../outside.arrow",
    "arrow/t.1/../../../outside.arrow",
    "/etc/passwd",
    "",
    "arrow//x.arrow",
    "arrow/./x.arrow",
    "..",
    "arrow\\..\\..\\outside.arrow",
    "arrow/%2e%2e/%2e%2e/outside.arrow",
    "arrow/x.arrow\x00",
    "arrow/x.arrow/",
]


@pytest.fixture()
def layout(tmp_path: Path) -> tuple[SegmentStore, Path]:
    outside = tmp_path / "outside.arrow"
    outside.write_bytes(b"not yours")
    root = tmp_path / "segments"
    root.mkdir()
    return SegmentStore(str(root)), outside


def _every_operation(store: SegmentStore, rel: str) -> list[tuple[str, Any]]:
    batch: list[pa.RecordBatch] = [empty_batch()]
    return [
        ("open_file", lambda: store.open_file(rel)),
        ("exists", lambda: store.exists(rel)),
        ("delete", lambda: store.delete(rel)),
        ("location", lambda: store.location(rel)),
        ("write", lambda: store.write(batch, rel, None)),
    ]


@pytest.mark.parametrize("rel", BAD)
def test_segment_store_refuses_paths_that_leave_its_root(layout: tuple[SegmentStore, Path], rel: str) -> None:
    store, outside = layout
    for what, call in _every_operation(store, rel):
        with pytest.raises(UnsafePath):
            call()
            pytest.fail(f"{what}({rel!r}) was allowed")
    assert outside.read_bytes() == b"not yours"
    assert sorted(os.listdir(outside.parent)) == ["outside.arrow", "segments"]
    assert list(Path(store.base).rglob("*")) == []


@pytest.mark.parametrize("rel", BAD)
def test_locate_refuses_paths_that_leave_the_root(tmp_path: Path, rel: str) -> None:
    for root in (str(tmp_path), "s3://bucket/raftmq"):
        with pytest.raises(UnsafePath):
            locate(root, rel)


def test_a_symlink_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "00000-1-2.n1.arrow"
    victim.write_bytes(b"not yours")
    root = tmp_path / "segments"
    (root / "arrow").mkdir(parents=True)
    (root / "arrow" / "t.1").symlink_to(elsewhere, target_is_directory=True)
    store = SegmentStore(str(root))
    rel = "arrow/t.1/00000-1-2.n1.arrow"
    for _, call in _every_operation(store, rel):
        with pytest.raises(UnsafePath):
            call()
    assert victim.read_bytes() == b"not yours"
    assert [rel for rel, _, _ in store.list_files()] == []  # garbage collection never sees it


def test_ordinary_segment_paths_are_accepted(tmp_path: Path) -> None:
    rel = "arrow/orders.7/00003-00000000000000000010-00000000000000000020.n1.arrow"
    assert checked_rel(rel) == rel
    store = SegmentStore(str(tmp_path / "segments"))
    written = store.write([empty_batch()], rel, None)
    assert store.exists(written.arrow)
    assert store.location(rel) == str(tmp_path / "segments" / rel)
    assert [r for r, _, _ in store.list_files()] == [rel]
    assert locate(str(tmp_path), rel) == str(tmp_path / rel)
