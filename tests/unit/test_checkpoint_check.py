"""What a fetched checkpoint must prove before a snapshot install may use it (issue 12, item 3):
``checkpoints._check_checkpoint`` over real RocksDB checkpoints."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from raftmq.cluster.node import checkpoints
from raftmq.storage.keys import APPLIED, encode_u64
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch, StoreError


def _received(tmp_path: Path, *, group: str = "0", applied: int = 50, said: int | None = None) -> str:
    """A checkpoint as ``Checkpoints.open_stream`` sends it, extracted: ``checkpoint/`` and ``meta.json``."""
    dest = tmp_path / "incoming"
    store = RocksStore.open(str(tmp_path / "state"))
    batch = Batch()
    batch.put(APPLIED, encode_u64(applied))
    store.write(batch, sync=True)
    store.checkpoint(str(dest / "checkpoint"))
    store.close()
    meta = {"group": group, "node_id": "n2", "applied_index": applied if said is None else said}
    (dest / "meta.json").write_bytes(orjson.dumps(meta))
    return str(dest)


def test_a_checkpoint_at_or_past_the_snapshot_passes(tmp_path: Path) -> None:
    assert checkpoints._check_checkpoint("0", _received(tmp_path, applied=50), need=40) == 50
    assert checkpoints._check_checkpoint("0", _received(tmp_path / "b", applied=40), need=40) == 40


def test_a_checkpoint_behind_the_snapshot_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs 60"):
        checkpoints._check_checkpoint("0", _received(tmp_path, applied=50), need=60)


def test_a_checkpoint_of_another_group_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="group '1'"):
        checkpoints._check_checkpoint("0", _received(tmp_path, group="1"), need=10)


def test_a_checkpoint_behind_what_its_source_said_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="its source said"):
        checkpoints._check_checkpoint("0", _received(tmp_path, applied=50, said=70), need=10)


def test_a_checkpoint_that_does_not_open_is_refused(tmp_path: Path) -> None:
    dest = Path(_received(tmp_path))
    (dest / "checkpoint" / "CURRENT").write_text("MANIFEST-999999\n")  # names a file that is not there
    with pytest.raises(StoreError):
        checkpoints._check_checkpoint("0", str(dest), need=10)
