"""The voters of a Raft group as its log says, from pysyncobj's membership entries (``pso.py``
reads them): what ``raft.py`` needs on start and after a snapshot."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from raftmq.cluster.replication.contract import Outcome
from raftmq.cluster.replication.journal import Entry
from raftmq.cluster.replication.pso import membership_change
from raftmq.cluster.replication.snapshot_gate import entry_from_json

__all__ = ["MembershipChange", "members_after", "members_on_start"]


@dataclass(eq=False)
class MembershipChange:
    """A voter change a leader proposed and has not answered yet (compared by identity)."""

    action: str
    addr: str
    on_done: Callable[[Outcome], None]


def members_after(
    base: Iterable[str], entries: Iterable[Entry], after_index: int, upto_index: int | None = None
) -> list[str]:
    """The voters once the membership entries of ``entries`` with an index in
    ``(after_index, upto_index]`` are applied, in log order, to the voters ``base``."""
    members = set(base)
    for command, index, _term in entries:
        if index <= after_index or (upto_index is not None and index > upto_index):
            continue
        change = membership_change(command)
        if change is not None:
            action, addr = change
            if action == "add":
                members.add(addr)
            elif action == "rem":
                members.discard(addr)
    return sorted(members)


def members_on_start(
    manifest: dict[str, Any] | None, entries: list[Entry], seed: list[str]
) -> tuple[int, list[str], list[str]]:
    """(base index, voters at it, voters now) from a group's snapshot ``manifest`` and journal
    ``entries``, as pysyncobj will load them: the entries after the snapshot count only if the
    journal holds the snapshot's prev and last entries (otherwise pysyncobj clears it)."""
    if manifest is None:
        return 0, seed, members_after(seed, entries, 0)
    last, prev = entry_from_json(manifest["last"]), entry_from_json(manifest["prev"])
    base = list(manifest.get("cluster") or seed)
    held = {(e[1], e[2]) for e in entries}
    if (prev[1], prev[2]) in held and (last[1], last[2]) in held:
        return last[1], base, members_after(base, entries, last[1])
    return last[1], base, base
