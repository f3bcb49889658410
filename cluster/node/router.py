"""Routing to a group's leader: where it is, forwarding a request to it, and writes at it.

Writes go to the leader of the group concerned: served here when this node leads it, otherwise
forwarded to the leader (one hop; a forwarded request is never forwarded again). Failures that
certainly did nothing are retried at the next leader until ``leader_wait_s`` has passed.

One :class:`LeaderRouter` per node; the HTTP handlers (``cluster/api/``), the change coordinator
(``changes.py``) and the receive coordinator (``receive_coordinator.py``) route through it. A write
this node leads runs here, in the node layer (:class:`~raftmq.cluster.node.actions.LeaderActions`);
one it does not lead goes to the leader's ``/internal/groups/{g}/{action}``, which runs the same.

Nothing here speaks HTTP to clients: a failure is a :class:`RaftmqError` with its catalogue code
(the API renders it), a forwarded request's answer a :class:`Forwarded` (the API returns it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import aiohttp
import orjson
import yarl

from raftmq.cluster import commands
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import CatalogError, RaftmqError
from raftmq.cluster.base.groups import META
from raftmq.cluster.config.cluster_file import NodeConfig
from raftmq.cluster.node.actions import METADATA_INDEX, METADATA_INDEX_HEADER, LeaderActions
from raftmq.cluster.node.node import Node
from raftmq.cluster.replication.upgrade import to_json_batch

__all__ = [
    "FORWARDED",
    "NOT_SENT",
    "PEER_FAILURES",
    "Forwarded",
    "Here",
    "LeaderRouter",
    "as_routed",
    "body_error",
    "peer_call",
    "peer_error",
]

FORWARDED = "X-Raftmq-Forwarded"
# Peer-call failures where the request certainly never left this node (no connection was made):
# definite, so safe to retry at the next leader.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# Everything a call to another node can fail with: no connection, a reset, a timeout, a broken or
# undecodable answer (orjson's error is a ValueError).
FILE_POOL_WAIT_S = 5.0  # how long a file passed on waits for a connection of its pool (open_at)
PEER_FAILURES = (TimeoutError, aiohttp.ClientError, OSError, ValueError)
# Methods that change nothing: whatever happened to the call, nothing was done.
_READS = frozenset({"GET", "HEAD", "OPTIONS"})

Here = Callable[[], Awaitable[dict[str, Any]]]
"""What a caller runs itself when this node leads the group (an action of the API's own, such as
a push stream's ``take``), instead of the node's :class:`LeaderActions`."""


class Forwarded(NamedTuple):
    """The leader's answer to a forwarded request, as it came: the API returns it unchanged."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str]


def body_error(status: int, data: bytes) -> RaftmqError:
    """The error of a peer's error answer (its catalogue code, message and fields)."""
    try:
        return CatalogError.from_body(orjson.loads(data)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return CatalogError(errors.UNKNOWN_OUTCOME, f"peer answered HTTP {status}")


def peer_error(e: BaseException, method: str, peer: str) -> RaftmqError:
    """The error a client gets for a call to ``peer`` that failed with ``e`` (one of
    :data:`PEER_FAILURES`): always a retriable 503. ``unavailable`` (definite) when nothing can
    have been done: no connection was made, or the call only read; else ``unknown_outcome`` (the
    peer may have done it)."""
    if isinstance(e, NOT_SENT):
        return CatalogError(errors.UNAVAILABLE, f"cannot reach {peer}")
    if method.upper() in _READS:
        return CatalogError(errors.UNAVAILABLE, f"no answer from {peer} ({type(e).__name__})")
    return CatalogError(errors.UNKNOWN_OUTCOME, f"lost the answer of {peer} ({type(e).__name__})")


@contextlib.contextmanager
def peer_call(method: str, peer: str) -> Iterator[None]:
    """Around a call to another node (``peer`` names it in the message): any of
    :data:`PEER_FAILURES` becomes :func:`peer_error`, never a 500. The error middleware applies
    the same rule to a peer failure a handler left unmapped."""
    try:
        yield
    except PEER_FAILURES as e:
        raise peer_error(e, method, peer) from None


def _unknown_to_old_leader(data: bytes) -> bool:
    try:
        code = orjson.loads(data)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False
    return code in (errors.INVALID_JSON.code, errors.NOT_FOUND.code)


class LeaderRouter:
    """Finds a group's leader and calls it (or this node, when it leads). One instance per node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = node.config.limits
        # How long a request may wait for a group to elect a leader: two election timeouts, and at
        # least 3 s (a split vote can take a second round).
        self.election_max_s = node.config.raft.election_max_ms / 1000
        self.leader_wait_s = max(3.0, 2 * self.election_max_s)
        self.actions = LeaderActions(node)

    async def wait_leader(self, name: str, timeout_s: float) -> Any:
        """The leader of group ``name``, waiting up to ``timeout_s`` for one to be known.

        A group not hosted here is looked up at the peers at once. A local replica that knows no
        leader is given one election timeout to learn of it (an election ends so); after that the
        peers are asked too, every half second: the replica may be cut off, or removed from the
        group without knowing it, while the group goes on under a leader elsewhere."""
        start = time.monotonic()
        deadline = start + timeout_s
        ask_peers_at = start if name not in self.node.groups else start + self.election_max_s
        while True:
            leader = self.node.leader_of(name)
            if leader is not None:
                return leader
            now = time.monotonic()
            if now >= deadline:
                raise CatalogError(errors.UNAVAILABLE, f"group {name} has no leader right now")
            if now >= ask_peers_at:
                await self.node.refresh_peer_status()
                ask_peers_at = time.monotonic() + (0.5 if name in self.node.groups else 0.0)
            await asyncio.sleep(0.05)

    async def leader_elsewhere(self, name: str) -> Any:
        """The leader of group ``name`` (waiting up to ``leader_wait_s``), which this node must not be:
        a call to it goes over the network."""
        leader = await self.wait_leader(name, self.leader_wait_s)
        if leader.id == self.node.me.id:
            raise CatalogError(errors.UNAVAILABLE, f"group {name} is electing a leader")
        return leader

    def leads(self, name: str) -> bool:
        local = self.node.groups.get(name)
        return local is not None and local.raft.is_leader()

    def serves_reads(self, name: str) -> bool:
        """This node leads group ``name`` and has applied its term's first entry, so its replica
        holds every acknowledged write (:meth:`LeaderActions.serves_reads`). Does not wait."""
        return self.actions.serves_reads(name)

    async def reads_here(self, name: str) -> bool:
        """Whether this node answers a read of group ``name``'s state itself (it leads and serves
        reads, a new leader waited for briefly) or asks the leader (False); raises ``unavailable``
        for a new leader that does not serve reads in time (:meth:`LeaderActions.reads_here`)."""
        return await self.actions.reads_here(name)

    async def read_at_leader(self, name: str, path: str, timeout_s: float) -> Any:
        """The JSON answer of ``GET path`` (an ``/internal`` read of group ``name``'s state) at the
        group's leader, another node (ask :meth:`reads_here` first). The leader answers from its
        state only once it serves reads, else ``not_leader``; that answer (leadership moved on),
        an unreachable leader and one not ready yet are asked again at the leader known then until
        ``leader_wait_s`` has passed. A failure is a :class:`RaftmqError` (503 for a lost call)."""
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            leader = await self.leader_elsewhere(name)
            try:
                with peer_call("GET", f"the leader {leader.id} of group {name}"):
                    status, data, _ = await self.node.peer_request("GET", leader, path, timeout_s=timeout_s)
                    if status == 200:
                        return orjson.loads(data)
                raise body_error(status, data)
            except RaftmqError as e:
                if not (e.retriable and e.definite) or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def forward(
        self,
        method: str,
        path_qs: str,
        name: str,
        body: bytes | None = None,
        *,
        forwarded: bool = False,
        accept: str | None = None,
        keep_headers: tuple[str, ...] = (),
        timeout_s: float | None = None,
    ) -> Forwarded:
        """Send a request (``method`` and ``path_qs`` with ``body``) to the leader of group ``name``
        and return its answer unchanged: its body, status, content type and the ``keep_headers``
        (e.g. a fetch's positions). ``forwarded``: the request came from a peer, which took this
        node for the leader (refused with ``not_leader``: never forwarded twice). ``accept``
        asks for an answer other than JSON (the binary or Arrow fetch); ``timeout_s`` bounds the
        call (default: the request timeout and a margin; a long poll needs its wait on top).

        A ``not_leader`` answer (leadership moved on; nothing was done), and a failed call that did
        nothing (the leader was unreachable, e.g. just killed; or a read whose answer was lost),
        are retried against the newly known leader until ``leader_wait_s`` has passed, as
        :meth:`group_call` does for writes. Any other failure of the call is a 503
        (:func:`peer_error`), never a 500.
        """
        if forwarded:
            raise CatalogError(errors.NOT_LEADER, f"this node ({self.node.me.id}) does not lead group {name}")
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            leader = await self.leader_elsewhere(name)
            try:
                answer, index = await self._pass_on(
                    leader,
                    f"the leader {leader.id} of group {name}",
                    method,
                    path_qs,
                    body,
                    accept=accept,
                    keep_headers=keep_headers,
                    timeout_s=timeout_s,
                )
            except RaftmqError as e:
                if not e.definite or time.monotonic() >= deadline:
                    raise
            else:
                if answer.status != errors.NOT_LEADER.status or time.monotonic() >= deadline:
                    if name == META and method not in _READS and answer.status < 300:
                        await self._metadata_applied(int(index) if index.isdigit() else None)
                    return answer
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def _metadata_applied(self, index: Any, timeout_s: float = 2.0) -> None:
        """Return once the local metadata replica has applied ``index`` (a metadata write made at
        the leader elsewhere: the leader's applied index after it), or after ``timeout_s`` (a
        lagging replica: its reads stay behind). A node's reads of topics then follow the writes it
        passed on, so a client that changed a topic through it reads the change back."""
        if self.node.metadata is None or not isinstance(index, int) or isinstance(index, bool):
            return
        deadline = time.monotonic() + timeout_s
        while self.node.metadata.applied_index < index and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    @contextlib.asynccontextmanager
    async def open_at(
        self, peer: NodeConfig, what: str, method: str, path_qs: str, *, read_timeout_s: float
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A request to node ``peer`` itself (not a group's leader: e.g. the node holding a file),
        its answer's body left to be read as it comes (a file passed on a part at a time, not held
        whole). No total timeout (a large body to a slow reader takes what it takes): each read
        waits at most ``read_timeout_s`` for the peer's next bytes (not while the reader has
        paused it). A call that fails before the answer's head is :func:`peer_error`; ``what``
        names the peer in its message. The connection is released on leaving."""
        session = self.node.file_session
        assert session is not None
        # connect: the wait for one of the pool's connections, then the peer's (the pool full of
        # slow downloads: a retriable 503 after it, not a wait without end).
        timeout = aiohttp.ClientTimeout(
            total=None, connect=FILE_POOL_WAIT_S, sock_connect=1.0, sock_read=read_timeout_s
        )
        with peer_call(method, what):
            resp = await session.request(
                method,
                as_routed(peer, path_qs),
                headers={FORWARDED: self.node.me.id},
                allow_redirects=False,  # the peer key goes to that node only
                timeout=timeout,
            )
        try:
            yield resp
        finally:
            resp.close()  # (a body read to its end gave its connection back already)

    async def _pass_on(
        self,
        peer: NodeConfig,
        what: str,
        method: str,
        path_qs: str,
        body: bytes | None,
        *,
        accept: str | None = None,
        keep_headers: tuple[str, ...] = (),
        timeout_s: float | None = None,
    ) -> tuple[Forwarded, str]:
        """The one call that passes a request on to another node: its answer and the metadata
        index it reported (``""`` when none). A failed call is :func:`peer_error`."""
        headers = {FORWARDED: self.node.me.id, "Content-Type": "application/json"}
        if accept is not None:
            headers["Accept"] = accept
        total_s = timeout_s if timeout_s is not None else self.limits.request_timeout_ms / 1000 + 16
        session = self.node.peer_session
        assert session is not None
        with peer_call(method, what):
            async with session.request(
                method,
                as_routed(peer, path_qs),
                data=body,
                headers=headers,
                allow_redirects=False,  # the peer key goes to that node only
                timeout=aiohttp.ClientTimeout(total=total_s, sock_connect=1.0),
            ) as resp:
                data = await resp.read()
                if resp.status >= 500 and resp.content_type != "application/json":
                    # Not a node's error body (every one is JSON): a broken answer.
                    raise ValueError(f"HTTP {resp.status} without an error body")
                kept = {k: v for k, v in resp.headers.items() if k in keep_headers}
                index = resp.headers.get(METADATA_INDEX_HEADER, "")
                return Forwarded(resp.status, data, resp.content_type, kept), index

    async def propose_checked(self, name: str, command: bytes) -> dict[str, Any]:
        """Propose ``command`` to group ``name``, which this node leads (:class:`LeaderActions`)."""
        return await self.actions.propose_checked(name, command)

    async def barrier(self, name: str) -> dict[str, Any]:
        """A read barrier of group ``name``, which this node leads: one ``noop`` shared by the reads
        waiting at once (:meth:`LeaderActions.barrier`, ``barriers.py``)."""
        return await self.actions.barrier(name)

    async def group_call(
        self,
        g: int | str,
        action: str,
        body: dict[str, Any],
        size_hint: int | None = None,
        *,
        here: Here | None = None,
    ) -> dict[str, Any]:
        """Run an internal write ``action`` at the leader of group ``g``: here (:class:`LeaderActions`,
        or ``here`` when the caller runs the action itself) or at the leader's
        ``/internal/groups/{g}/{action}``.

        Failures that certainly did nothing (the leader was unreachable, or is no longer the
        leader) are retried against the newly known leader until ``leader_wait_s`` has passed, so
        a client sees one slow answer across an election instead of an error.
        """
        name = str(g)
        deadline = time.monotonic() + self.leader_wait_s
        while True:
            try:
                return await self._group_call_once(name, action, body, size_hint, here)
            except RaftmqError as e:
                if not (e.retriable and e.definite) or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.1)
            self.node.forget_peer_status()

    async def _gate_topic_command(self, body: dict[str, Any]) -> None:
        """Refuse (``upgrade_in_progress``) a topic command carrying an op or field level that a
        metadata voter does not apply yet. Checked here, at the node that builds the command, not
        only at the leader: a leader of the release before would write the field without knowing
        it, and its replicas would ignore what the upgraded ones apply (docs/operations.md)."""
        op = body.get("op")
        levels = []
        if op in ("set_topic_tags", "set_topic_retention"):
            levels.append(f"meta.{op}")
        if op == "create_topic" and body.get("tags"):
            levels.append("meta.create_topic.tags")
        if op == "set_topic_attributes" and body.get("expect") is not None:
            levels.append("meta.set_topic_attributes.expect")
        for level in levels:
            if not await self.node.await_group_supports(META, level):
                message = f"a metadata voter does not apply {level} yet (a rolling upgrade)"
                raise CatalogError(errors.UPGRADE_IN_PROGRESS, message)

    async def _group_call_once(
        self, name: str, action: str, body: dict[str, Any], size_hint: int | None, here: Here | None = None
    ) -> dict[str, Any]:
        if name == META and action == "topic_command":
            await self._gate_topic_command(body)
        if self.leads(name):
            if here is not None:
                return await here()
            return await self.actions.run(name, action, body, size_hint)
        leader = await self.leader_elsewhere(name)
        # Binary batches travel as an append command's bytes (its now_ms is the leader's to set).
        raw = commands.append(0, body["items"]) if action == "append" else None
        with peer_call("POST", f"the leader {leader.id} of group {name}"):
            status, data, _ = await self.node.peer_request(
                "POST",
                leader,
                f"/internal/groups/{name}/{action}",
                body=body if raw is None else None,
                raw=raw,
                timeout_s=self.limits.request_timeout_ms / 1000 + 5,
            )
        if raw is not None and status in (400, 404) and _unknown_to_old_leader(data):
            # A leader of the version before binary appends (a rolling upgrade): it read the bytes
            # as JSON (invalid_json) or knows no such action (not_found); nothing was done. The
            # same batches as its JSON produce command.
            batches = [to_json_batch(now_ms(), *item) for item in body["items"]]
            return await self._group_call_once(name, "produce", {"batches": batches}, size_hint)
        if status != 200:
            raise body_error(status, data)
        result: dict[str, Any] = orjson.loads(data)
        if name == META:  # read back here what was written there
            await self._metadata_applied(result.get(METADATA_INDEX))
        return result


def as_routed(peer: NodeConfig, path_qs: str) -> yarl.URL:
    """The URL at ``peer`` of a request this node routed (``path_qs``: aiohttp's, percent-encoded
    but for the characters that need none, dots included), sent as it is: a segment ``.`` or
    ``..`` (a consumer group or member id a client named ``%2E%2E``) encoded again, and nothing
    normalized. Given as text, the HTTP client removed such segments as a URL's dot segments are,
    and the peer, which takes the peer key as a check made, served another route than the one
    checked here (``/v1/groups/../members`` became ``/v1/members``). The peer's base is parsed
    apart first: taken as encoded, a host beyond ASCII would go out without its IDNA encoding."""
    path, mark, query = path_qs.partition("?")
    segments = ("%2E" * len(s) if s in (".", "..") else s for s in path.split("/"))
    base = str(yarl.URL(peer.http_url))
    return yarl.URL(base + "/".join(segments) + mark + query, encoded=True)
