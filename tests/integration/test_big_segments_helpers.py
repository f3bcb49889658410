"""``big_segments.wait_answered_ok`` without a node: a download socket the node closed, or that
answers an error, fails the test at once. Raised as an AssertionError inside ``wait_until``'s
predicate, it counted as "not yet" and the test waited the full 30 s before failing."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from .big_segments import wait_answered_ok


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected pair: the test's download socket and the node's end of it."""
    ours, node = socket.socketpair()
    yield ours, node
    ours.close()
    node.close()


def _fails_at_once(ours: socket.socket, expected: str) -> None:
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=expected):
        wait_answered_ok([ours])
    assert time.monotonic() - started < 5, "waited for the timeout instead of failing at once"


def test_a_connection_the_node_closed_fails_at_once(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, node = pair
    node.close()
    _fails_at_once(ours, "closed a download's connection")


def test_an_error_answer_fails_at_once(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, node = pair
    node.sendall(b"HTTP/1.1 503 Service Unavailable\r\n")
    _fails_at_once(ours, "not 200")


def test_a_200_answer_is_waited_for_and_left_unread(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, node = pair
    node.sendall(b"HTTP/1.1 200 OK\r\n")
    wait_answered_ok([ours])
    assert ours.recv(17) == b"HTTP/1.1 200 OK\r\n"  # peeked only: the answer is still there to read
