"""The producer's requests in flight per leader, against a real 3-node cluster: with
``max_requests_per_leader`` above 1, a queue's batch does not wait for its leader's answer to
another queue (docs/client.md, "Batching")."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from raftmq.client import Admin, AsyncProducer, RecordMetadata
from raftmq.client import _accumulator as accumulator

from .harness import Cluster

HOLD_S = 10.0  # the longest the relay holds the first produce answer


class HoldingRelay:
    """A TCP relay to one node that holds the node's answer to the first produce request it
    carries until a produce request arrives on another connection, or ``HOLD_S`` passes: while
    it holds, that request is in flight as far as the producer can tell (the node has stored and
    answered it). ``overlapped`` says whether the second produce request came while the first's
    answer was held."""

    def __init__(self, node_port: int) -> None:
        self.node_port = node_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.answer_held = threading.Event()  # the first answer reached the relay and waits
        self.release = threading.Event()
        self.overlapped = False
        self._posts = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.node_port)) as node:
            first = client.recv(65536)
            if not first:
                return
            hold = False
            if first.startswith(b"POST "):
                with self._lock:
                    self._posts += 1
                    hold = self._posts == 1
                    if self._posts == 2 and not self.release.is_set():
                        self.overlapped = True
                        self.release.set()
            node.sendall(first)
            threading.Thread(target=self._pump, args=(client, node, False), daemon=True).start()
            self._pump(node, client, hold)

    def _pump(self, src: socket.socket, dst: socket.socket, hold: bool) -> None:
        try:
            while data := src.recv(65536):
                if hold:
                    self.answer_held.set()
                    self.release.wait(HOLD_S)
                    hold = False
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def no_leader_wait_cap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A batch waits for its leader's answer at most ``LEADER_WAIT_S`` (100 ms) whatever the rule;
    raised far above the relay's hold, so only the rule can send a batch during the hold."""
    monkeypatch.setattr(accumulator, "LEADER_WAIT_S", 60.0)
    yield


def test_a_queue_s_batch_goes_while_its_leader_answers_another_queue(
    cluster: Cluster, no_leader_wait_cap: None
) -> None:
    """With ``max_requests_per_leader=2``, while the leader's answer for queue A is held on its way
    back, a message for queue B (same leader) is sent at once on a second connection instead of
    waiting for that answer; both are stored once, where the answers say."""
    topic = "in-flight"
    urls = [n.url for n in cluster.nodes.values()]
    with Admin(urls) as admin:
        desc = admin.create_topic(topic, 6)
    groups = [str(q.group_id) for q in desc.queue_states]
    queue_a, queue_b = [q for q, g in enumerate(groups) if g == groups[0]][:2]
    leader_url = cluster.nodes[cluster.wait_leader(groups[0])].url
    relay = HoldingRelay(int(leader_url.rsplit(":", 1)[1]))
    armed = threading.Event()

    def address_map(url: str) -> str:
        return f"http://127.0.0.1:{relay.port}" if armed.is_set() and url == leader_url else url

    async def main() -> tuple[RecordMetadata, RecordMetadata, bool]:
        async with AsyncProducer(
            urls, address_map=address_map, metadata_max_age_ms=600_000, max_requests_per_leader=2
        ) as producer:
            for q in (queue_a, queue_b):  # the topic's leaders known
                await producer.send_and_wait(topic, "warm", queue=q)
            armed.set()
            a = await producer.send(topic, "a", queue=queue_a)
            assert await asyncio.to_thread(relay.answer_held.wait, 10), "A's request never got there"
            assert not a.done()
            b = await producer.send(topic, "b", queue=queue_b)
            async with asyncio.timeout(HOLD_S / 2):  # long before the hold ends by itself
                meta_b = await b
            meta_a = await a
            return meta_a, meta_b, relay.overlapped

    try:
        meta_a, meta_b, overlapped = asyncio.run(main())
    finally:
        relay.close()
    assert overlapped  # B's request came while A's answer was held
    assert (meta_a.queue, meta_a.offset, meta_b.queue, meta_b.offset) == (queue_a, 1, queue_b, 1)
    for q, value in ((queue_a, "a"), (queue_b, "b")):
        assert [m["value"] for m in cluster.fetch_all(topic, q)] == ["warm", value]
