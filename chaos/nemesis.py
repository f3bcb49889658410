"""Nemeses: faults with a start and a stop, and a seeded schedule of them.

A fault's ``start(cluster, rng)`` does the damage and returns what it did (JSON: nodes, grudge,
offsets), which the runner records as the ``start`` operation; ``stop(cluster, value)`` undoes
exactly that. Both block (docker calls): the runner runs them in a thread. Which nodes a fault hits
comes from the seeded ``rng``, except where it depends on the cluster (the current leader).

| name | start | stop |
|---|---|---|
| kill | SIGKILL one node | start it again |
| kill-leader | SIGKILL the leader of a random queue group | start it again |
| kill-majority | SIGKILL a majority of the nodes | start them again |
| pause | freeze one node (``docker pause``, the cgroup freezer) | thaw it |
| partition-one | cut one node off from all the others | heal |
| partition-halves | cut the cluster in a random majority and minority | heal |
| partition-bridge | two halves that can reach one bridge node but not each other | heal |
| partition-leader | cut off the leader of a random queue group | heal |
| isolate-kill-leader | cut off a queue group's leader, let it run alone 1.5 s, SIGKILL it | heal, start it |
| packet-loss | every node drops a random share of its peers' packets | heal |
| clock-skew | jump the clocks of up to a majority-minus-one of nodes by seconds to a minute | reset |
| clock-jump-leader | move a queue group leader's clock 3 days ahead | reset, restart it |
| disk-full | fill one node's volume to the last byte | free it, restart the node if it stopped |
| checkpoint-fetch | kill a node, compact the rest, restart it: checkpoint fetches stall, then fail | heal |
| raft-strangers | idle, partial and garbage connections to every Raft port | close them, record refusals |
| power-loss | one node loses power: kill -9, every write it never fsynced dropped | start it again |
| power-loss-leader | the leader of a random queue group loses power | start it again |
| power-loss-all | every node loses power at once | start them again |

The power-loss faults are in ``powerloss_nemesis`` (they need the power-loss file system).

Topologies: a run has 1, 3 or 5 nodes (``TOPOLOGIES``). A fault that needs peers (a partition,
packet loss between nodes, a minority's clocks apart from the others', compaction by the others) has
``min_nodes = 2``; a leader's clock days ahead (``clock-jump-leader``) needs none: what it checks is
the state machine's bound on its group's time, and its heal restarts the node alone.
``faults_for(nodes)`` lists the faults a cluster of that size can run, which is what ``all`` and
the shorthands expand to, and naming one it cannot run is an error. On one node
the others all hit that node: it leads every group, so a kill, a leader's kill, a majority's kill
are one fault, and so are the three power losses.

Partitions are iptables DROP rules inside the containers on traffic from peers; clients on the host
always reach every node, as in Jepsen.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .cluster import ChaosCluster
from .powerloss_nemesis import power_loss_all, power_loss_leader, power_loss_one, power_restore
from .strangers import RaftStrangers, refused_by_node

__all__ = [
    "FAULTS",
    "TOPOLOGIES",
    "Fault",
    "Planned",
    "check_faults",
    "faults_for",
    "parse_faults",
    "schedule",
    "time_for_each",
]

Value = dict[str, Any]
ALONE_S = 1.5  # how long isolate-kill-leader lets the cut-off leader run before killing it
COMPACT_AFTER_S = 1.0  # checkpoint-fetch: writes the killed node misses before the others compact
STALL_S = 2.0  # checkpoint-fetch: how long the restarted node's fetches hang before they fail
CLOCK_JUMP_S = 3 * 24 * 3600  # clock-jump-leader: how far ahead the leader's clock moves
# The cluster sizes a run may have: one node (replication 1, a lone voter in every group), or an
# odd majority of 3 or 5 (replication 3).
TOPOLOGIES = (1, 3, 5)


@dataclass(frozen=True)
class Fault:
    name: str
    start: Callable[[ChaosCluster, random.Random], Value]
    stop: Callable[[ChaosCluster, Value], None]
    description: str
    min_nodes: int = 1  # 2: it needs peers to cut, skew apart or compact


def _running(c: ChaosCluster) -> list[str]:
    return [n for n in c.node_ids if c.running(n)]


def _kill(c: ChaosCluster, nodes: list[str]) -> Value:
    for n in nodes:
        c.kill(n)
    return {"nodes": nodes}


def _restart(c: ChaosCluster, v: Value) -> None:
    c.restart_all(v.get("nodes", []))


def _kill_one(c: ChaosCluster, rng: random.Random) -> Value:
    return _kill(c, [rng.choice(_running(c))])


def _kill_leader(c: ChaosCluster, rng: random.Random) -> Value:
    group = rng.choice(c.groups()[1:])
    leader = c.leader(group)
    if leader is None:
        return {"group": group, "nodes": [], "note": "no leader to kill"}
    return {"group": group, **_kill(c, [leader])}


def _kill_majority(c: ChaosCluster, rng: random.Random) -> Value:
    return _kill(c, sorted(rng.sample(c.node_ids, len(c.node_ids) // 2 + 1)))


def _pause(c: ChaosCluster, rng: random.Random) -> Value:
    n = rng.choice(_running(c))
    c.pause(n)
    return {"nodes": [n]}


def _unpause(c: ChaosCluster, v: Value) -> None:
    for n in v["nodes"]:
        c.unpause(n)


def _cut(c: ChaosCluster, sides: list[list[str]]) -> Value:
    """Every node of each side drops packets from every node of the other sides."""
    grudge: dict[str, set[str]] = {}
    for i, side in enumerate(sides):
        others = {n for j, s in enumerate(sides) if j != i for n in s}
        for n in side:
            grudge[n] = others
    c.drop_from(grudge)
    return {"sides": sides}


def _bridge_grudge(c: ChaosCluster, nodes: list[str]) -> Value:
    """Halves A and B with a bridge node between them: A and B cannot talk, the bridge talks to all.
    With 3 nodes: one node each."""
    half = (len(nodes) - 1) // 2
    a, bridge, b = nodes[:half], nodes[half], nodes[half + 1 :]
    grudge = {n: set(b) for n in a} | {n: set(a) for n in b}
    c.drop_from(grudge)
    return {"sides": [a, b], "bridge": bridge}


def _partition_one(c: ChaosCluster, rng: random.Random) -> Value:
    n = rng.choice(c.node_ids)
    return _cut(c, [[n], [m for m in c.node_ids if m != n]])


def _partition_halves(c: ChaosCluster, rng: random.Random) -> Value:
    nodes = rng.sample(c.node_ids, len(c.node_ids))
    k = len(nodes) // 2
    return _cut(c, [sorted(nodes[:k]), sorted(nodes[k:])])


def _partition_bridge(c: ChaosCluster, rng: random.Random) -> Value:
    return _bridge_grudge(c, rng.sample(c.node_ids, len(c.node_ids)))


def _partition_leader(c: ChaosCluster, rng: random.Random) -> Value:
    # A queue group's leader: that is where acknowledged messages are at stake. (The metadata
    # group's leader is cut off often enough by the other partitions.)
    group = rng.choice(c.groups()[1:])
    leader = c.leader(group) or rng.choice(c.node_ids)
    return {"group": group, **_cut(c, [[leader], [m for m in c.node_ids if m != leader]])}


def _heal(c: ChaosCluster, v: Value) -> None:
    c.heal_network()


def _isolate_kill_leader(c: ChaosCluster, rng: random.Random) -> Value:
    """Cut a queue group's leader off, let it run alone for a moment, then SIGKILL it: whatever it
    answered while alone must not have been acknowledged as durable."""
    value = _partition_leader(c, rng)
    leader = value["sides"][0][0]
    time.sleep(ALONE_S)
    c.kill(leader)
    return {**value, "nodes": [leader], "alone_s": ALONE_S}


def _heal_restart(c: ChaosCluster, v: Value) -> None:
    c.heal_network()
    _restart(c, v)


def _packet_loss(c: ChaosCluster, rng: random.Random) -> Value:
    p = rng.choice([0.1, 0.2, 0.3])
    c.lose_packets(p)
    return {"probability": p, "nodes": list(c.node_ids)}


def _clock_skew(c: ChaosCluster, rng: random.Random) -> Value:
    k = rng.randint(1, max(1, len(c.node_ids) // 2))
    offsets = {n: rng.choice([-30, -10, -3, 3, 10, 60]) for n in sorted(rng.sample(c.node_ids, k))}
    for n, s in offsets.items():
        c.set_clock_offset(n, s)
    return {"offsets_s": offsets}


def _clock_reset(c: ChaosCluster, v: Value) -> None:
    for n in v["offsets_s"]:
        c.set_clock_offset(n, 0)


def _clock_jump_leader(c: ChaosCluster, rng: random.Random) -> Value:
    """A queue group's leader's clock jumps days ahead: it stamps its commands days ahead, and its
    retention ticks must not remove messages that are within retention by the true time (the
    topic's retention_ms is hours; ChaosSpec.retention_ms)."""
    group = rng.choice(c.groups()[1:])
    leader = c.leader(group)
    if leader is None:
        return {"group": group, "nodes": [], "note": "no leader to skew"}
    c.set_clock_offset(leader, CLOCK_JUMP_S)
    return {"group": group, "nodes": [leader], "offset_s": CLOCK_JUMP_S}


def _clock_jump_heal(c: ChaosCluster, v: Value) -> None:
    for n in v["nodes"]:
        c.set_clock_offset(n, 0)
        # Its monotonic clock went back days too: its timers and sleeps would wait that long.
        if c.running(n):
            c.kill(n)
    _restart(c, v)


def _disk_full(c: ChaosCluster, rng: random.Random) -> Value:
    n = rng.choice(_running(c))
    return {"nodes": [n], "bytes": c.fill_disk(n)}


def _disk_free(c: ChaosCluster, v: Value) -> None:
    for n in v["nodes"]:
        c.free_disk(n)
        c.restart(n)  # a node that hit ENOSPC stops itself rather than diverge


def _checkpoint_fetch(c: ChaosCluster, rng: random.Random) -> Value:
    """One node must install snapshots while its checkpoint fetches hang, then fail: it is killed,
    the others compact every group past its log while the workload writes, and it starts again. It
    must apply nothing it did not verify, and catch up once fetches work."""
    n = rng.choice(_running(c))
    c.set_checkpoint_fetch_fault(n, "stall")
    c.kill(n)
    time.sleep(COMPACT_AFTER_S)  # entries the node misses
    compacted = []
    for m in _running(c):
        for group in c.groups():
            try:
                c.compact(m, group)
                compacted.append(f"{group}@{m}")
            except Exception:  # not a replica of that group, or busy: the others still compact
                continue
    c.restart(n)
    time.sleep(STALL_S)  # its first fetches hang (heartbeats must still count), then fail from now on
    c.set_checkpoint_fetch_fault(n, "fail")
    return {"nodes": [n], "modes": ["stall", "fail"], "stall_s": STALL_S, "compacted": compacted}


def _checkpoint_fetch_heal(c: ChaosCluster, v: Value) -> None:
    for n in v["nodes"]:
        c.set_checkpoint_fetch_fault(n, None)
    _restart(c, v)  # in case it was not running


def _raft_strangers(c: ChaosCluster, rng: random.Random) -> Value:
    targets = {n: c.raft_addresses(n) for n in c.node_ids}
    strangers = RaftStrangers(targets, seed=rng.randrange(1 << 30))
    c.nemesis_state["raft-strangers"] = strangers
    strangers.start()
    return {"nodes": list(targets), "ports_per_node": len(targets[c.node_ids[0]])}


def _raft_strangers_stop(c: ChaosCluster, v: Value) -> None:
    """Stop the traffic; the value records what it did and what each node counts as refused."""
    strangers = c.nemesis_state.pop("raft-strangers")
    v["refused"] = refused_by_node({n: c.url(n) for n in _running(c)})
    v["strangers"] = strangers.stop()


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in [
        Fault("kill", _kill_one, _restart, "SIGKILL one node, then start it again"),
        Fault("kill-leader", _kill_leader, _restart, "SIGKILL the leader of a random queue group"),
        Fault("kill-majority", _kill_majority, _restart, "SIGKILL a majority of nodes, then start them"),
        Fault("pause", _pause, _unpause, "freeze one node with the cgroup freezer, then thaw it"),
        Fault("partition-one", _partition_one, _heal, "cut one node off from the others", min_nodes=2),
        Fault(
            "partition-halves",
            _partition_halves,
            _heal,
            "split into a random majority and minority",
            min_nodes=2,
        ),
        Fault(
            "partition-bridge",
            _partition_bridge,
            _heal,
            "two halves joined only through one node",
            min_nodes=2,
        ),
        Fault(
            "partition-leader",
            _partition_leader,
            _heal,
            "cut off the leader of a random queue group",
            min_nodes=2,
        ),
        Fault(
            "isolate-kill-leader",
            _isolate_kill_leader,
            _heal_restart,
            "cut off a queue group's leader, then SIGKILL it",
            min_nodes=2,
        ),
        Fault("packet-loss", _packet_loss, _heal, "drop 10-30% of packets between nodes", min_nodes=2),
        Fault("clock-skew", _clock_skew, _clock_reset, "jump the clocks of a minority of nodes", min_nodes=2),
        Fault(
            "clock-jump-leader",
            _clock_jump_leader,
            _clock_jump_heal,
            "move a queue group leader's clock 3 days ahead, then back (and restart it)",
        ),
        Fault("disk-full", _disk_full, _disk_free, "fill one node's volume"),
        Fault(
            "checkpoint-fetch",
            _checkpoint_fetch,
            _checkpoint_fetch_heal,
            "snapshot installs on one node while its checkpoint fetches stall, then fail",
            min_nodes=2,
        ),
        Fault("power-loss", power_loss_one, power_restore, "one node loses power and its unsynced writes"),
        Fault("power-loss-leader", power_loss_leader, power_restore, "a queue group's leader loses power"),
        Fault("power-loss-all", power_loss_all, power_restore, "every node loses power at once"),
        Fault(
            "raft-strangers",
            _raft_strangers,
            _raft_strangers_stop,
            "idle, partial-frame and garbage connections to every node's Raft ports",
        ),
    ]
}


def faults_for(nodes: int) -> list[str]:
    """The faults a cluster of ``nodes`` can run, in ``FAULTS`` order."""
    if nodes not in TOPOLOGIES:
        raise ValueError(f"a chaos cluster has {', '.join(map(str, TOPOLOGIES))} nodes, not {nodes}")
    return [name for name, f in FAULTS.items() if nodes >= f.min_nodes]


def parse_faults(spec: str, nodes: int = 3) -> list[str]:
    """``all``, ``none`` or a comma-separated list of fault names (``partition`` = every partition,
    ``kills`` = every kill, ``power-losses`` = every power loss), of the faults a cluster of
    ``nodes`` can run: the shorthands leave the others out, a name of one of them is an error."""
    if spec in ("", "none"):
        return []
    usable = faults_for(nodes)
    names: list[str] = []
    for word in spec.split(","):
        word = word.strip()
        if word == "all":
            names += usable
        elif word in ("partition", "partitions"):
            names += [n for n in usable if n.startswith("partition")]
        elif word == "kills":
            names += [n for n in usable if "kill" in n]
        elif word == "power-losses":
            names += [n for n in usable if n.startswith("power-loss")]
        elif word in usable:
            names.append(word)
        else:
            raise ValueError(
                _refusal(word, nodes, f"all, partition, kills, power-losses, {', '.join(usable)}")
            )
    return list(dict.fromkeys(names))


def check_faults(names: Iterable[str], nodes: int) -> None:
    """Raise ValueError unless ``nodes`` is a topology and each name is a fault it can run: names,
    not shorthands (the runner looks each one up in ``FAULTS``), and refused before any container
    starts, not at the fault's time."""
    usable = faults_for(nodes)
    for name in names:
        if name not in usable:
            raise ValueError(_refusal(name, nodes, ", ".join(usable)))


def _refusal(word: str, nodes: int, known: str) -> str:
    if word in FAULTS:
        return f"nemesis {word!r} needs at least {FAULTS[word].min_nodes} nodes, not {nodes}"
    return f"unknown nemesis {word!r} (known: {known})"


@dataclass(frozen=True)
class Planned:
    at_s: float  # when to start, seconds after the workload started
    duration_s: float
    fault: str


def schedule(
    faults: list[str],
    seed: int,
    time_limit_s: float,
    quiet_s: tuple[float, float] = (3.0, 6.0),
    fault_s: tuple[float, float] = (6.0, 10.0),
) -> list[Planned]:
    """Quiet, fault, quiet, fault, ... until ``time_limit_s``. Faults come in seeded shuffled rounds so
    that each appears once before any repeats. Same arguments, same plan."""
    rng = random.Random(seed)
    plan: list[Planned] = []
    t = 0.0
    queue: list[str] = []
    while faults:
        t += rng.uniform(*quiet_s)
        duration = rng.uniform(*fault_s)
        if t + duration > time_limit_s:
            break
        if not queue:
            queue = rng.sample(faults, len(faults))
        plan.append(Planned(round(t, 2), round(duration, 2), queue.pop(0)))
        t += duration
    return plan


def time_for_each(
    faults: list[str], quiet_s: tuple[float, float] = (3.0, 6.0), fault_s: tuple[float, float] = (6.0, 10.0)
) -> float:
    """A time limit long enough for ``schedule`` to inject every fault at least once."""
    return len(faults) * (quiet_s[1] + fault_s[1]) + 1.0
