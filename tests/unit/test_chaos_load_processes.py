"""The pieces that let the production load run in processes of its own: another process's history
merged into the run's in time order, and the address map shared through a file."""

from __future__ import annotations

import os
import time
from pathlib import Path

from raftmq.chaos.history import History, load_history
from raftmq.chaos.load import AddressFile


def test_child_histories_are_merged_from_their_files_in_time_order_without_holding_them(
    tmp_path: Path,
) -> None:
    parent = History(tmp_path / "history.jsonl", keep=False)
    children = [
        History(
            tmp_path / f"child-{n}.jsonl",
            t0_ns=parent.t0_ns,
            first_process=(n + 1) * 1_000_000_000,
            keep=False,
        )
        for n in range(2)
    ]
    parent.append(type="invoke", process=parent.new_process(), f="fetch")
    children[0].append(type="invoke", process=children[0].new_process(), f="enqueue", value="L0-0")
    children[1].append(type="invoke", process=children[1].new_process(), f="enqueue", value="L1-0")
    parent.append(type="ok", process=1, f="fetch", messages=[])
    children[0].append(type="ok", process=1_000_000_001, f="enqueue", value="L0-0", queue=2, offset=7)
    for child in children:
        child.close()
    assert children[0].ops == []  # kept only in its file
    added = parent.merge_files([tmp_path / "child-0.jsonl", tmp_path / "child-1.jsonl"])
    parent.append(type="info", process="nemesis", f="heal")  # appends go on after the merge
    parent.close()
    assert added == 3
    assert parent.ops == []
    on_disk = load_history(tmp_path / "history.jsonl")
    assert [op["index"] for op in on_disk] == list(range(6))
    assert [op["time"] for op in on_disk] == sorted(op["time"] for op in on_disk)
    assert [(op["process"], op["type"]) for op in on_disk] == [
        (1, "invoke"), (1_000_000_001, "invoke"), (2_000_000_001, "invoke"), (1, "ok"), (1_000_000_001, "ok"),
        ("nemesis", "info"),
    ]  # fmt: skip
    assert not (tmp_path / "history.jsonl.merging").exists()


def test_a_kept_history_holds_the_merged_operations_too(tmp_path: Path) -> None:
    parent = History(tmp_path / "history.jsonl")
    child = History(tmp_path / "child.jsonl", t0_ns=parent.t0_ns, first_process=1_000_000_000, keep=False)
    child.append(type="invoke", process=child.new_process(), f="enqueue", value="L0-0")
    parent.append(type="invoke", process=parent.new_process(), f="fetch")
    child.close()
    parent.merge_files([tmp_path / "child.jsonl"])
    parent.close()
    assert parent.ops == load_history(tmp_path / "history.jsonl")
    assert [op["process"] for op in parent.ops] == [1_000_000_001, 1]


def test_the_address_file_follows_the_parents_map(tmp_path: Path) -> None:
    parent = AddressFile(tmp_path / "addresses.json")
    child = AddressFile(tmp_path / "addresses.json", recheck_s=0)
    parent.publish({"n1": "http://127.0.0.1:4001", "n2": None})
    assert child("http://n1:8080") == "http://127.0.0.1:4001"
    assert child("http://n2:8080") is None  # down: nothing is sent
    assert child("http://n9:8080") is None
    time.sleep(0.01)
    parent.publish({"n1": "http://127.0.0.1:4002", "n2": "http://127.0.0.1:4003"})
    os.utime(tmp_path / "addresses.json")  # a coarse mtime still moves
    assert child("http://n1:8080") == "http://127.0.0.1:4002"
    assert child("http://n2:8080") == "http://127.0.0.1:4003"
