"""What each peer advertised last, kept across this node's restarts (``<node_dir>/peers.json``).

A leader writes a gated op or field only once every voter of the group has advertised it
(``Node.group_supports``, docs/operations.md "What a leader writes while voters run different
releases"). What a peer advertised is kept while the peer is down. Kept only in memory, it was
lost when this node restarted: a node that came back while a voter was still down treated that
voter as an older release until it returned. Meanwhile its gated writes were refused (503
``upgrade_in_progress``) or written in their older form. A consumer's commit then lost its
``advance`` and became a plain set, so a late copy of an older commit moved a committed offset back
(the 10,000 msgs/s chaos soak saw it once, after a whole-cluster power loss with a node kept down).

The file holds, per peer, the capabilities it advertised and whether it reads record-batch format
2. It is rewritten (a new file renamed over the old one) only when a peer's answer changes it.
It is a cache, never a source of truth: a missing, damaged or unreadable file is an empty one,
which only makes the node more careful (it asks the peers again), and each status answer
replaces what it says of that peer. Peers that left the configuration are not dropped: the
entries are a few hundred bytes each and only read for voters.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import structlog

__all__ = ["PeerReleases"]

log = structlog.get_logger("raftmq.node")


class PeerReleases:
    """Peers' advertised capabilities and record-batch format 2, loaded from and saved to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.capable: dict[str, frozenset[str]] = {}  # what each peer advertised last (upgrade.py)
        self.v2_nodes: set[str] = set()  # peers that advertised record-batch format 2
        self.heard: set[str] = set()  # peers that answered since this node started
        self._load()

    def _load(self) -> None:
        try:
            data = orjson.loads(self.path.read_bytes())
            peers = data["peers"]
            capable = {str(n): frozenset(str(c) for c in p["capabilities"]) for n, p in peers.items()}
            v2 = {str(n) for n, p in peers.items() if p["batch_v2"] is True}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("peer_releases_unreadable", path=str(self.path), error=str(e))
            return
        self.capable.update(capable)
        self.v2_nodes.update(v2)

    def record(self, node_id: str, capabilities: frozenset[str], batch_v2: bool) -> bool:
        """What ``node_id`` advertised now; saved when it changes what is known. Returns whether it
        did (a peer upgraded or rolled back: what was judged of the groups it votes in is stale)."""
        changed = self.capable.get(node_id) != capabilities or (node_id in self.v2_nodes) != batch_v2
        self.heard.add(node_id)
        self.capable[node_id] = capabilities
        if batch_v2:
            self.v2_nodes.add(node_id)
        else:
            self.v2_nodes.discard(node_id)
        if changed:
            self._save()
        return changed

    def _save(self) -> None:
        peers = {
            n: {"capabilities": sorted(caps), "batch_v2": n in self.v2_nodes}
            for n, caps in sorted(self.capable.items())
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps({"peers": peers}))
            os.replace(tmp, self.path)
        except OSError as e:  # a full disk: the next change tries again; memory still knows
            log.warning("peer_releases_not_saved", path=str(self.path), error=str(e))
