"""PeerReleases: peers' advertised releases kept across restarts; a bad file is an empty one."""

from __future__ import annotations

from pathlib import Path

from raftmq.cluster.node.peer_releases import PeerReleases

CAPS = frozenset({"commit_offsets.advance", "subscribe.records"})


def test_what_peers_advertised_is_known_again_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "n1" / "peers.json"
    first = PeerReleases(path)
    first.record("n2", CAPS, batch_v2=True)
    first.record("n3", frozenset({"subscribe.records"}), batch_v2=False)
    again = PeerReleases(path)
    assert again.capable == {"n2": CAPS, "n3": frozenset({"subscribe.records"})}
    assert again.v2_nodes == {"n2"}
    assert again.heard == set()  # known from the file, not heard since this start


def test_a_new_answer_replaces_what_was_kept(tmp_path: Path) -> None:
    path = tmp_path / "peers.json"
    PeerReleases(path).record("n2", CAPS, batch_v2=True)
    later = PeerReleases(path)
    assert later.record("n2", CAPS, batch_v2=True) is False  # the same answer: nothing to judge again
    assert later.record("n2", frozenset(), batch_v2=False) is True  # the peer now runs an older release
    assert later.heard == {"n2"}
    assert PeerReleases(path).capable == {"n2": frozenset()}
    assert PeerReleases(path).v2_nodes == set()


def test_a_damaged_or_missing_file_is_an_empty_one(tmp_path: Path) -> None:
    assert PeerReleases(tmp_path / "missing.json").capable == {}
    for damaged in (b"", b"{not json", b'{"peers": {"n2": {"capabilities": 7}}}', b"[]"):
        path = tmp_path / "peers.json"
        path.write_bytes(damaged)
        kept = PeerReleases(path)
        assert kept.capable == {} and kept.v2_nodes == set()
        kept.record("n2", CAPS, batch_v2=True)  # and is written again whole
        assert PeerReleases(path).capable == {"n2": CAPS}
