"""The bound on HTTP connections with no request under way (cluster/api/connections.py)."""

from __future__ import annotations

import asyncio

from raftmq.cluster.api.connections import IdleConnections


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: _Transport | None = _Transport()


def _opened(idle: IdleConnections, n: int) -> list[_Protocol]:
    protocols = [_Protocol() for _ in range(n)]
    for p in protocols:
        assert p.transport is not None
        idle.opened(p, p.transport)
    return protocols


def test_one_over_the_cap_closes_the_connection_idle_the_longest() -> None:
    evicted: list[int] = []
    idle = IdleConnections(3, lambda: evicted.append(1))
    first, second, *_ = _opened(idle, 4)
    assert first.transport is not None and first.transport.closing
    assert second.transport is not None and not second.transport.closing
    assert len(idle) == 3 and len(evicted) == 1


def test_a_connection_serving_a_request_is_not_counted_nor_closed() -> None:
    idle = IdleConnections(2, lambda: None)
    serving, *_ = _opened(idle, 2)
    idle.busy(serving)
    _opened(idle, 3)  # the other idle ones are pushed out, not the one being served
    assert serving.transport is not None and not serving.transport.closing
    assert len(idle) == 2
    idle.done(serving)  # kept alive: idle again, the newest
    assert len(idle) == 2 and not serving.transport.closing


def test_a_connection_lost_while_serving_is_not_counted_again() -> None:
    idle = IdleConnections(2, lambda: None)
    (p,) = _opened(idle, 1)
    idle.busy(p)
    idle.closed(p)
    p.transport = None  # what aiohttp's protocol does when the connection is lost
    idle.done(p)
    assert len(idle) == 0
