"""``raftmq cluster ...`` prints every change of placement it sees while following a change, so a
move that starts and ends between two polls is still reported (``_placement_changes``)."""

from raftmq.cluster.cli.cluster import _placement_changes


def test_a_moved_replica_names_its_source_and_target() -> None:
    before = {"meta": ["n1", "n2", "n3"], "0": ["n1", "n2", "n3"], "1": ["n2", "n3", "n1"]}
    after = {"meta": ["n1", "n2", "n3"], "0": ["n4", "n2", "n3"], "1": ["n2", "n3", "n4"]}
    assert _placement_changes(before, after) == [
        "group 0: replica moved from n1 to n4",
        "group 0: preferred leader n1 -> n4",
        "group 1: replica moved from n1 to n4",
    ]


def test_unchanged_groups_print_nothing() -> None:
    groups = {"meta": ["n1", "n2", "n3"], "0": ["n1", "n2", "n3"]}
    assert _placement_changes(groups, dict(groups)) == []


def test_a_new_preferred_leader_alone() -> None:
    assert _placement_changes({"2": ["n1", "n2", "n3"]}, {"2": ["n3", "n1", "n2"]}) == [
        "group 2: preferred leader n1 -> n3"
    ]


def test_replicas_added_or_removed_mid_move() -> None:
    assert _placement_changes({"0": ["n1", "n2", "n3"]}, {"0": ["n1", "n2", "n3", "n4"]}) == [
        "group 0: replica added n4"
    ]
    assert _placement_changes({"0": ["n1", "n2", "n3", "n4"]}, {"0": ["n2", "n3", "n4"]}) == [
        "group 0: replica removed n1",
        "group 0: preferred leader n1 -> n2",
    ]


def test_groups_sort_meta_first_then_by_number() -> None:
    before = {"10": ["a"], "2": ["a"], "meta": ["a"]}
    after = {"10": ["b"], "2": ["b"], "meta": ["b"]}
    assert list(dict.fromkeys(line.split(":")[0] for line in _placement_changes(before, after))) == [
        "group meta",
        "group 2",
        "group 10",
    ]
