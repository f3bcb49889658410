"""``raft_doubles.free_port``: ports a replica can bind later, which nothing else takes meanwhile:
never the same twice, none in the kernel's ephemeral range (where any bind to port 0 or any
outgoing connection could take it first), and none another live process was given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from local_ports import BLOCK_PORTS, ephemeral_ports
from raft_doubles import free_port

_CHILD = """
import sys
from raft_doubles import free_port
print(*(free_port() for _ in range(int(sys.argv[1]))), flush=True)
sys.stdin.read()  # holds its blocks until the test closes its input
"""


def test_no_port_is_handed_out_twice_nor_from_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(3 * BLOCK_PORTS)]  # across blocks
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if p in ephemeral_ports()]


def test_a_process_running_at_the_same_time_gets_other_ports() -> None:
    """As another test run, or another pytest-xdist worker, would."""
    mine = [free_port()]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(2 * BLOCK_PORTS)],
        cwd=Path(__file__).parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        theirs = [int(p) for p in child.stdout.readline().split()]
        mine += [free_port() for _ in range(2 * BLOCK_PORTS)]  # the rest of a block, and more
    finally:
        child.communicate("")
    assert len(theirs) == 2 * BLOCK_PORTS
    assert not set(mine) & set(theirs)
