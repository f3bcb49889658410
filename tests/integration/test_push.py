"""The push stream (WebSocket per subscription) on a real 3-node cluster: credits (RDY) bound what is
in flight, FIN/REQ/TOUCH act as ack/nack/extend, heartbeats drop silent clients, a dead socket or
client process loses nothing (its messages come back after their deadline), bad frames get
bad_request and change nothing. Every frame the node sends is checked against the OpenAPI spec."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema_rs
import orjson
import pytest

from raftmq.cluster.api.openapi.spec import openapi_spec

from .conftest import assert_error
from .harness import Cluster

pytestmark = pytest.mark.timeout(240)

DELIVERY = "[delivery]\nmax_deliveries = 3\nbackoff_ms = [300]\ntick_ms = 100\n"
SPEC = openapi_spec()
SERVER_FRAME = jsonschema_rs.validator_for(
    {"$ref": "#/components/schemas/PushServerFrame", "components": SPEC["components"]}
)
CLIENT_FRAME = jsonschema_rs.validator_for(
    {"$ref": "#/components/schemas/PushClientFrame", "components": SPEC["components"]}
)


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("push")
    with Cluster(tmp, nodes=3, extra_toml=DELIVERY) as cluster:
        cluster.start()
        cluster.wait_ready()
        cluster.wait_balanced()  # the first test's stream ran across the balancer's handovers once
        yield cluster
        for nid in cluster.nodes:
            assert cluster.alive(nid), f"{nid} died:\n{cluster.log(nid)[-3000:]}"


def stream_path(topic: str, group: str, **params: Any) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"/v1/topics/{topic}/subscriptions/{group}/stream" + (f"?{query}" if query else "")


def ws_url(c: Cluster, path: str, node: str = "n1") -> str:
    return "ws://" + c.nodes[node].http + path


def produce(c: Cluster, topic: str, values: list[str], queues: int) -> None:
    r = c.produce(topic, [{"value": v, "queue": i % queues} for i, v in enumerate(values)])
    assert r.status_code == 200, r.text


def http_receive(c: Cluster, topic: str, group: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"/v1/topics/{topic}/subscriptions/{group}/receive", {"wait_ms": 0, **body})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


class Stream:
    """A test client of the push stream: frames in and out, each checked against the spec."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, frame: dict[str, Any]) -> None:
        assert CLIENT_FRAME.is_valid(frame), frame
        await self.ws.send_str(orjson.dumps(frame).decode())

    async def next(self, timeout_s: float = 10) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=timeout_s)
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        frame: dict[str, Any] = orjson.loads(msg.data)
        assert SERVER_FRAME.is_valid(frame), frame
        return frame

    async def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """No message is pushed for ``seconds``; the other frames that came meanwhile."""
        others = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = await self.next(left)
            except TimeoutError:
                break
            assert frame["type"] != "messages", f"unexpected push {frame}"
            others.append(frame)
        return others


async def open_stream(session: aiohttp.ClientSession, url: str) -> Stream:
    stream = Stream(await session.ws_connect(url))
    hello = await stream.next()
    assert hello["type"] == "hello", hello
    return stream


# -- credits, FIN, REQ, TOUCH ------------------------------------------------------------------


def test_push_never_exceeds_rdy_and_pushes_more_as_messages_are_finished(c: Cluster) -> None:
    c.create_topic("credits", queues=3)
    sent = [f"m{i}" for i in range(30)]
    produce(c, "credits", sent, 3)

    async def run() -> list[str]:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, ws_url(c, stream_path("credits", "g")))
            await stream.send({"op": "rdy", "n": 0})
            assert await stream.quiet(0.7) == []  # no credit, no push
            await stream.send({"op": "rdy", "n": 4})
            outstanding: dict[str, str] = {}
            seen: list[str] = []
            finished = 0
            while finished < len(sent):
                frame = await stream.next()
                if frame["type"] == "messages":
                    for m in frame["messages"]:
                        outstanding[m["receipt"]] = m["value"]
                        seen.append(m["value"])
                    assert len(outstanding) <= 4, outstanding  # never more in flight than RDY
                elif frame["type"] == "result":
                    assert all(r["ok"] for r in frame["results"]), frame
                    finished += len(frame["results"])
                if outstanding and (len(outstanding) == 4 or len(seen) == len(sent)):
                    if len(seen) < 12:  # at the credit limit nothing more comes (checked twice)
                        for f in await stream.quiet(0.4):
                            assert f["type"] == "result" and all(r["ok"] for r in f["results"]), f
                            finished += len(f["results"])
                    done = list(outstanding)[:2]
                    for r in done:
                        del outstanding[r]
                    await stream.send({"op": "fin", "receipts": done, "id": len(seen)})
            return seen

    seen = asyncio.run(asyncio.wait_for(run(), 60))
    assert sorted(seen) == sorted(sent)  # each exactly once, every one finished
    assert http_receive(c, "credits", "g", wait_ms=300) == []
    offsets = c.get("/v1/groups/g/offsets", params={"topic": "credits"}).json()["offsets"]
    assert offsets == {"0": 10, "1": 10, "2": 10}


def test_fin_req_and_touch_are_ack_nack_and_extend(c: Cluster) -> None:
    c.create_topic("settle", queues=1)
    produce(c, "settle", ["a", "b", "c"], 1)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(
                session, ws_url(c, stream_path("settle", "g", visibility_ms=3000), "n2")
            )
            await stream.send({"op": "rdy", "n": 3})
            got: dict[str, dict[str, Any]] = {}
            while len(got) < 3:
                frame = await stream.next()
                got.update({m["value"]: m for m in frame["messages"]})
            a, b, done = got["a"], got["b"], got["c"]
            start = time.monotonic()

            await stream.send({"op": "touch", "receipts": [a["receipt"]], "visibility_ms": 30_000, "id": "t"})
            await stream.send({"op": "req", "receipts": [b["receipt"]], "delay_ms": 600, "id": "r"})
            await stream.send({"op": "fin", "receipts": [done["receipt"]], "id": "f"})
            await stream.send({"op": "fin", "receipts": [done["receipt"]], "id": "f2"})
            replies: dict[str, dict[str, Any]] = {}
            again: dict[str, Any] | None = None
            while again is None or len(replies) < 5:
                frame = await stream.next()
                if frame["type"] == "result":
                    replies[frame["id"]] = frame
                elif frame["type"] == "messages":
                    (again,) = frame["messages"]
                    await stream.send({"op": "fin", "receipts": [again["receipt"]], "id": "g"})
            (touched,) = replies["t"]["results"]
            assert touched["ok"] and touched["deadline_ms"] >= a["deadline_ms"] + 20_000
            assert replies["r"]["results"] == [{"receipt": b["receipt"], "ok": True}]
            assert replies["f"]["results"] == [{"receipt": done["receipt"], "ok": True}]
            assert replies["f2"]["results"][0]["error"]["code"] == "stale_receipt"
            # REQ with a delay: b comes back, on the stream, not before the delay.
            assert again["value"] == "b" and again["attempt"] == 2
            assert time.monotonic() - start >= 0.6
            # TOUCH: a is not redelivered after its first deadline (3 s; plus the 300 ms backoff
            # and a margin), its receipt stays valid.
            first_due_s = (a["deadline_ms"] + 300 + 700) / 1000
            assert await stream.quiet(max(0.0, first_due_s - time.time())) == []
            assert time.time() > first_due_s - 0.7
            assert replies["g"]["results"] == [{"receipt": again["receipt"], "ok": True}]
            await stream.send({"op": "fin", "receipts": [a["receipt"]], "id": 9})
            frame = await stream.next()
            assert frame == {
                "type": "result",
                "op": "fin",
                "id": 9,
                "results": [{"receipt": a["receipt"], "ok": True}],
            }
            await stream.send({"op": "ping", "id": "p"})
            assert await stream.next() == {"type": "pong", "id": "p"}

    asyncio.run(asyncio.wait_for(run(), 60))
    offsets = c.get("/v1/groups/g/offsets", params={"topic": "settle"}).json()["offsets"]
    assert offsets == {"0": 3}


# -- dead sockets and dead clients ------------------------------------------------------------


def _raw_stream(c: Cluster, path: str) -> socket.socket:
    """A WebSocket by hand (so that it can be cut with a reset, no closing handshake)."""
    host, port = c.nodes["n3"].http.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def _send_text(s: socket.socket, data: bytes) -> None:
    mask = os.urandom(4)
    assert len(data) < 126
    s.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def _recv_frame(s: socket.socket) -> dict[str, Any]:
    first, second = _recv_exactly(s, 2)
    size = second & 0x7F
    if size == 126:
        (size,) = struct.unpack("!H", _recv_exactly(s, 2))
    elif size == 127:
        (size,) = struct.unpack("!Q", _recv_exactly(s, 8))
    payload = _recv_exactly(s, size)
    assert first & 0x0F == 0x1, first  # text
    frame: dict[str, Any] = orjson.loads(payload)
    return frame


# The visibility of the messages a cut-off client took: long enough that the check "still in
# flight" right after the cut runs well before their deadline on a slow machine too.
CUT_VISIBILITY_MS = 4000


def _redelivered_after_deadline(c: Cluster, topic: str, taken: dict[str, int]) -> None:
    """Every offset in ``taken`` (offset -> deadline_ms) comes back with attempt 2, not before its
    deadline; then they are acked."""
    assert http_receive(c, topic, "g") == []  # still in flight: nothing is handed out early
    back: dict[int, dict[str, Any]] = {}
    limit = time.monotonic() + 30
    while len(back) < len(taken) and time.monotonic() < limit:
        for m in http_receive(c, topic, "g", wait_ms=3000, max=100):
            assert time.time() * 1000 >= taken[str(m["offset"])] - 5, "redelivered before the deadline"
            back[m["offset"]] = m
    assert sorted(map(str, back)) == sorted(taken)
    assert {m["attempt"] for m in back.values()} == {2}
    receipts = [m["receipt"] for m in back.values()]
    r = c.post(f"/v1/topics/{topic}/subscriptions/g/ack", {"receipts": receipts})
    assert all(x["ok"] for x in r.json()["results"]), r.text


def test_a_reset_socket_loses_nothing_its_messages_come_back_after_their_deadline(c: Cluster) -> None:
    c.create_topic("cutsock", queues=1)
    produce(c, "cutsock", [f"m{i}" for i in range(6)], 1)
    s = _raw_stream(c, stream_path("cutsock", "g", visibility_ms=CUT_VISIBILITY_MS, heartbeat_ms=60000))
    try:
        assert _recv_frame(s)["type"] == "hello"
        _send_text(s, b'{"op":"rdy","n":6}')
        taken: dict[str, int] = {}
        while len(taken) < 6:
            frame = _recv_frame(s)
            taken.update({str(m["offset"]): m["deadline_ms"] for m in frame["messages"]})
    finally:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset: no closing handshake
    _redelivered_after_deadline(c, "cutsock", taken)


KILLED_CLIENT = """
import asyncio, sys, aiohttp, orjson
async def main():
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(sys.argv[1]) as ws:
            await ws.send_str('{"op":"rdy","n":100}')
            async for msg in ws:
                frame = orjson.loads(msg.data)
                for m in frame.get("messages", []):
                    print(m["offset"], m["deadline_ms"], flush=True)
asyncio.run(main())
"""


def test_a_killed_client_process_loses_nothing_its_messages_come_back_after_their_deadline(
    c: Cluster,
) -> None:
    c.create_topic("killed", queues=1)
    produce(c, "killed", [f"m{i}" for i in range(5)], 1)
    url = ws_url(c, stream_path("killed", "g", visibility_ms=CUT_VISIBILITY_MS), "n2")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        taken = dict(proc.stdout.readline().decode().split() for _ in range(5))
    finally:
        proc.kill()
        proc.wait()
    _redelivered_after_deadline(c, "killed", {k: int(v) for k, v in taken.items()})


def test_messages_a_closing_stream_took_are_given_back_at_once(c: Cluster) -> None:
    """The stream closes while its take waits; what the take then gets is nacked with delay 0 (not
    left in flight until its 60 s deadline)."""
    c.create_topic("giveback", queues=1)
    leader = c.get("/v1/topics/giveback").json()["queues"][0]["leader"]
    other = next(n for n in c.nodes if n != leader)  # the give-back goes over HTTP to the leader
    path = stream_path("giveback", "g", visibility_ms=60000)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, ws_url(c, path, other))
            await stream.send({"op": "rdy", "n": 5})
            await asyncio.sleep(0.1)  # the take is waiting in the coordinator's line (1 s)
            await stream.ws.close()

    asyncio.run(asyncio.wait_for(run(), 30))
    produce(c, "giveback", ["a", "b", "c"], 1)
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got += http_receive(c, "giveback", "g", wait_ms=1000)
    assert sorted(m["value"] for m in got) == ["a", "b", "c"], got


# -- heartbeats --------------------------------------------------------------------------------


def test_a_client_that_stops_answering_pings_is_dropped_and_one_that_answers_stays(c: Cluster) -> None:
    c.create_topic("beats", queues=1)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            silent = await session.ws_connect(
                ws_url(c, stream_path("beats", "g", heartbeat_ms=300)), autoping=False
            )
            # Answers pings while it reads; it has half its heartbeat to answer (1 s: a pong
            # cannot be late on a busy machine).
            alive = await session.ws_connect(ws_url(c, stream_path("beats", "g", heartbeat_ms=2000)))
            frames: list[dict[str, Any]] = []

            async def read() -> None:
                async for msg in alive:
                    frames.append(orjson.loads(msg.data))

            reader = asyncio.create_task(read())
            start = time.monotonic()
            kinds = []
            while True:
                msg = await silent.receive(timeout=10)
                kinds.append(msg.type)
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
            assert aiohttp.WSMsgType.PING in kinds  # the node pinged it ...
            # ... and dropped it when no pong came: after about 450 ms, well before the default
            # heartbeat (5 s) would have.
            assert time.monotonic() - start < 5
            await asyncio.sleep(max(0.0, 5.0 - (time.monotonic() - start)))  # pinged twice or more
            await alive.send_str('{"op": "ping", "id": 1}')
            deadline = time.monotonic() + 10
            while len(frames) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert not alive.closed and [f["type"] for f in frames] == ["hello", "pong"]  # still open
            await alive.close()
            await reader

    asyncio.run(asyncio.wait_for(run(), 60))


# -- bad input ---------------------------------------------------------------------------------


BAD_FRAMES: list[tuple[bytes, dict[str, Any]]] = [
    (b"garbage", {}),
    (b"\xff\xfe", {}),
    (b"[1, 2]", {}),
    (b'{"op": "nope"}', {}),
    (b'{"id": 1}', {"id": 1}),
    (b'{"op": "rdy"}', {"op": "rdy"}),
    (b'{"op": "rdy", "n": -1}', {"op": "rdy"}),
    (b'{"op": "rdy", "n": "3"}', {"op": "rdy"}),
    (b'{"op": "rdy", "n": 10001}', {"op": "rdy"}),
    (b'{"op": "rdy", "n": true}', {"op": "rdy"}),
    (b'{"op": "fin", "id": 7}', {"op": "fin", "id": 7}),
    (b'{"op": "fin", "receipts": "1.0.0.1"}', {"op": "fin"}),
    (b'{"op": "fin", "receipts": []}', {"op": "fin"}),
    (b'{"op": "fin", "receipts": [1]}', {"op": "fin"}),
    (b'{"op": "fin", "receipts": ["nope"], "id": "x"}', {"op": "fin", "id": "x"}),
    (b'{"op": "fin", "receipts": ["01.0.0.1"]}', {"op": "fin"}),
    (b'{"op": "req", "receipts": ["1.0.0.1"], "delay_ms": -5}', {"op": "req"}),
    (b'{"op": "touch", "receipts": ["1.0.0.1"], "visibility_ms": 0}', {"op": "touch"}),
    (b'{"op": "fin", "receipts": ["1.0.0.1"], "extra": 1}', {"op": "fin"}),
    (b'{"op": "ping", "id": {"a": 1}}', {}),
    (b'{"op": "ping", "id": "' + b"x" * 65 + b'"}', {}),
]


def test_bad_frames_get_bad_request_and_change_nothing(c: Cluster) -> None:
    c.create_topic("badframes", queues=1)
    produce(c, "badframes", ["keep"], 1)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, ws_url(c, stream_path("badframes", "g"), "n3"))
            for raw, echoed in BAD_FRAMES:
                await stream.ws.send_frame(raw, aiohttp.WSMsgType.TEXT)
                frame = await stream.next()
                assert frame["type"] == "error" and frame["error"]["code"] == "bad_request", (raw, frame)
                assert {k: frame[k] for k in ("op", "id") if k in frame} == echoed, (raw, frame)
            await stream.ws.send_bytes(b'{"op": "ping"}')
            frame = await stream.next()
            assert frame["error"]["code"] == "bad_request", frame  # binary frames are not the protocol
            await stream.send({"op": "ping", "id": 1})
            assert await stream.next() == {"type": "pong", "id": 1}  # the stream survived
            await stream.send({"op": "rdy", "n": 1})
            (m,) = (await stream.next())["messages"]
            assert (m["value"], m["attempt"]) == ("keep", 1)  # nothing was settled by the bad frames

    asyncio.run(asyncio.wait_for(run(), 60))
    for nid in c.nodes:
        assert c.get("/healthz", nid).status_code == 200


def test_the_stream_route_refuses_bad_requests_before_upgrading(c: Cluster) -> None:
    c.create_topic("route", queues=1)
    assert_error(c.get(stream_path("route", "g")), 400, "bad_request")  # not a WebSocket request
    assert_error(c.get(stream_path("missing", "g")), 404, "topic_not_found")
    assert_error(c.get(stream_path("route", "bad group!")), 400, "bad_request")
    assert_error(c.get(stream_path("route", "g", heartbeat_ms=5)), 400, "bad_request")
    assert_error(c.get(stream_path("route", "g", visibility_ms=0)), 400, "bad_request")
    assert_error(c.get(stream_path("route", "g", other=1)), 400, "bad_request")

    async def run() -> int:
        async with aiohttp.ClientSession() as session:
            try:
                await session.ws_connect(ws_url(c, stream_path("missing", "g")))
            except aiohttp.WSServerHandshakeError as e:
                return e.status
            return 101

    assert asyncio.run(run()) == 404


def test_deleting_the_topic_ends_its_streams_with_a_fatal_error_frame(c: Cluster) -> None:
    c.create_topic("doomed", queues=1)

    async def run() -> tuple[dict[str, Any], int | None]:
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, ws_url(c, stream_path("doomed", "g")))
            await stream.send({"op": "rdy", "n": 5})
            await asyncio.sleep(0.3)
            assert c.session.delete(c.url() + "/v1/topics/doomed", timeout=30).status_code == 200
            frame = await stream.next(timeout_s=30)
            msg = await stream.ws.receive(timeout=10)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
            return frame, stream.ws.close_code

    frame, code = asyncio.run(asyncio.wait_for(run(), 60))
    assert frame["type"] == "error" and frame["fatal"] is True, frame
    assert frame["error"]["code"] == "topic_not_found", frame
    assert code == 4000


def test_streams_opening_and_closing_are_not_logged_at_the_default_level(c: Cluster) -> None:
    """A client that reconnects again and again must not flood the node's log (debug level)."""
    c.create_topic("quiet-log", queues=1)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            for node in ("n1", "n2", "n3"):
                for _ in range(3):
                    stream = await open_stream(session, ws_url(c, stream_path("quiet-log", "g"), node))
                    await stream.ws.close()

    asyncio.run(asyncio.wait_for(run(), 60))
    time.sleep(0.5)  # the closes are handled
    for nid in c.nodes:
        log = c.log(nid)
        assert "push_stream_opened" not in log and "push_stream_closed" not in log, nid


def test_a_stream_asking_for_a_subprotocol_is_refused_before_upgrading_and_not_logged(c: Cluster) -> None:
    """aiohttp logged each subprotocol it did not know, twice, the header quoted whole: a line per
    request of any token holder, at twice the bytes it sent."""
    c.create_topic("subprotocol", queues=1)
    before = {nid: c.log(nid).count("Client protocols") for nid in c.nodes}

    async def run() -> list[int]:
        statuses = []
        async with aiohttp.ClientSession() as session:
            for i in range(3):
                try:
                    async with session.ws_connect(
                        ws_url(c, stream_path("subprotocol", "g")), protocols=[f"{'x' * 4000}{i}"]
                    ):
                        statuses.append(101)
                except aiohttp.WSServerHandshakeError as e:
                    statuses.append(e.status)
        return statuses

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [400, 400, 400]
    headers = {"Sec-WebSocket-Protocol": "chat"}
    assert_error(c.get(stream_path("subprotocol", "g"), headers=headers), 400, "bad_request")
    assert {nid: c.log(nid).count("Client protocols") for nid in c.nodes} == before
