"""``raftmq repair-journal`` over a real RocksDB journal of a (stopped) node: what it reports, what it
deletes with ``--yes`` and nothing else, and what it refuses (a cut that keeps the damage, a group
name that is a path, a node or group that does not exist, a database another process holds)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from raftmq.cluster.cli.main import main
from raftmq.cluster.replication.journal import DurableJournal, JournalCorruptError
from raftmq.storage.rocks import RocksStore
from raftmq.storage.store import Batch

SECRET = "0123456789abcdef0123"
_U64 = struct.Struct(">Q")


@pytest.fixture()
def config(tmp_path: Path) -> Iterator[Path]:
    lines = ["[cluster]", f'secret = "{SECRET}"', "queue_groups = 1"]
    for i in (1, 2, 3):
        lines += [
            "[[nodes]]",
            f'id = "n{i}"',
            f'http = "127.0.0.1:{18000 + i}"',
            f'raft = "127.0.0.1:{17000 + 10 * i}"',
            f'data_dir = "{tmp_path / "data"}"',
        ]
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    yield path


def journal_path(config: Path, group: str = "0") -> str:
    return str(config.parent / "data" / "n2" / "groups" / group / "raft")


def write_journal(path: str, last: int = 10, damaged: tuple[int, ...] = (6,)) -> None:
    store = RocksStore.open(path)
    journal = DurableJournal(store)
    for i in range(1, last + 1):
        journal.add(f"cmd-{i}".encode(), i, 1)
    journal._destroy()
    for index in damaged:
        key = b"E" + _U64.pack(index)
        value = store.get(key)
        assert value is not None
        batch = Batch()
        batch.put(key, value[:-1] + bytes([value[-1] ^ 0x40]))
        store.write(batch, sync=True)
    store.close()


def disk(path: str) -> list[int]:
    store = RocksStore.open(path)
    try:
        return [_U64.unpack_from(k, 1)[0] for k, _ in store.scan(b"E", b"F")]
    finally:
        store.close()


def repair(config: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["repair-journal", "--config", str(config), "--node", "n2", *args])


def test_dry_run_reports_and_changes_nothing_then_yes_deletes_from_the_bad_index(config: Path) -> None:
    path = journal_path(config)
    write_journal(path)
    dry = repair(config, "--group", "0")
    assert dry.exit_code == 0, dry.output
    assert "a record that fails its checksum at index 6, then 4 good entries" in dry.output
    assert "plan: delete 5 records, entries 6..10" in dry.output
    assert "Dry run: nothing changed" in dry.output
    assert disk(path) == list(range(1, 11))

    done = repair(config, "--group", "0", "--yes")
    assert done.exit_code == 0, done.output
    assert "deleted 5 records (entries 6..10)" in done.output
    assert disk(path) == [1, 2, 3, 4, 5]
    store = RocksStore.open(path)
    try:
        assert [e[1] for e in DurableJournal(store)[:]] == [1, 2, 3, 4, 5]  # loads: the node can start
    finally:
        store.close()

    again = repair(config, "--group", "0", "--yes")
    assert again.exit_code == 0 and "nothing to repair" in again.output
    assert disk(path) == [1, 2, 3, 4, 5]


def test_truncate_from_an_earlier_index_deletes_from_there(config: Path) -> None:
    path = journal_path(config)
    write_journal(path)
    done = repair(config, "--group", "0", "--truncate-from", "3", "--yes")
    assert done.exit_code == 0, done.output
    assert disk(path) == [1, 2]


def test_truncate_from_past_the_damage_is_refused(config: Path) -> None:
    path = journal_path(config)
    write_journal(path)
    refused = repair(config, "--group", "0", "--truncate-from", "8", "--yes")
    assert refused.exit_code == 1
    assert "would keep the damage at index 6" in refused.output
    assert disk(path) == list(range(1, 11))
    store = RocksStore.open(path)
    try:
        with pytest.raises(JournalCorruptError):
            DurableJournal(store, group="0")
    finally:
        store.close()


@pytest.mark.parametrize("group", ["../0", "0/../../n1", "..", "/etc", "01", "meta/.."])
def test_a_group_that_is_not_a_group_name_is_refused(config: Path, group: str) -> None:
    result = repair(config, "--group", group, "--yes")
    assert result.exit_code == 1
    assert "--group must be 'meta' or a queue group's number" in result.output


def test_unknown_node_or_missing_journal_is_refused_without_creating_one(config: Path) -> None:
    unknown = CliRunner().invoke(
        main, ["repair-journal", "--config", str(config), "--node", "n9", "--group", "0"]
    )
    assert unknown.exit_code == 1 and "node 'n9' is not in" in unknown.output
    missing = repair(config, "--group", "meta")
    assert missing.exit_code == 1 and "has no journal of group meta" in missing.output
    assert not Path(journal_path(config, "meta")).exists()


def test_a_journal_held_open_is_refused(config: Path) -> None:
    path = journal_path(config)
    write_journal(path)
    holder = RocksStore.open(path)  # as a running node holds it
    try:
        result = repair(config, "--group", "0", "--yes")
    finally:
        holder.close()
    assert result.exit_code == 1
    assert "Is node n2 still running? Stop it first." in result.output
    assert disk(path) == list(range(1, 11))
