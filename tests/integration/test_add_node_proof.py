"""No credential goes to an address that arrived in a request (issue 12, item 1).

``POST /v1/cluster/nodes`` names an address; the node checking it sends a nonce and no credential,
and the node there must prove it holds the peer key (``cluster/config/keys.py``). A recording HTTP server
on 127.0.0.1 stands in for the address a client controls: it records every byte of every request.
Also here: each key derived from the cluster secret opens only what it guards, at a real node.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from raftmq.cluster.config.keys import BACKUP_HEADER, LEGACY_HEADER, PEER_HEADER, derive_keys, node_proof

from .cluster_changes import placement
from .conftest import assert_error
from .harness import SECRET, Cluster, wait_until

pytestmark = pytest.mark.timeout(300)

KEYS = derive_keys(SECRET)
# Every credential a node could leak, as text and as bytes in any case a header could carry.
CREDENTIALS = {
    "cluster secret": SECRET,
    "peer key": KEYS.peer,
    "raft key": KEYS.raft,
    "backup key": KEYS.backup,
}

Answer = Callable[[str, dict[str, str], bytes], tuple[int, bytes]]


class Recorder:
    """An HTTP server on 127.0.0.1 that records each request whole (request line, headers, body)
    and answers what ``answer(path, headers, body)`` returns."""

    def __init__(self, answer: Answer) -> None:
        self.requests: list[bytes] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                line = (self.requestline + "\r\n").encode("latin-1")
                recorder.requests.append(line + bytes(self.headers) + body)
                status, data = answer(self.path, dict(self.headers), body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def leaked(self) -> list[str]:
        """The credentials found anywhere in what was recorded."""
        seen = b"\n".join(self.requests).lower()
        return [name for name, value in CREDENTIALS.items() if value.lower().encode() in seen]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes, plus n4 in the cluster file with ``join = true`` (running, not added)."""
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(tmp, nodes=4, queue_groups=3, node_toml=lambda n: "join = true" if n == "n4" else "") as c:
        c.start()
        c.wait_ready()
        wait_until(lambda: placement(c)["placement"], 30, what="the placement recorded")
        yield c


def nodes_in_placement(c: Cluster) -> set[str]:
    return {n["id"] for n in placement(c)["placement"]["nodes"]}


def test_add_node_at_a_recording_server_is_refused_and_no_credential_reaches_it(cluster: Cluster) -> None:
    """The recorder answers every request as a willing node "x" with the Raft address asked for
    (what the status route of a node says): a node that sent its credential and trusted the
    answer would add it. Each node is the entry once (the others forward to the metadata leader)."""
    c = cluster
    before = placement(c)
    raft = "127.0.0.1:2"

    def answer(path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        claims = {"node_id": "x", "raft": raft, "groups": {}, "http": recorder.address, "proof": "0" * 64}
        return 200, json.dumps(claims).encode()

    with Recorder(answer) as recorder:
        answers = [
            c.post("/v1/cluster/nodes", {"id": "x", "http": recorder.address, "raft": raft}, node=entry)
            for entry in ("n1", "n2", "n3")
        ]
    assert recorder.leaked() == [], f"{recorder.leaked()} reached the recorder: {recorder.requests}"
    for r in answers:
        assert_error(r, 400, "bad_request")
        assert "did not prove" in r.json()["error"]["message"], r.text
    assert len(recorder.requests) == 3, recorder.requests  # the address was probed, once per attempt
    after = placement(c)
    assert after["placement"] == before["placement"] and after["change"] is None
    assert "x" not in nodes_in_placement(c)


@pytest.mark.parametrize("port", ["\u0661\u0662\u0663\u0664", "\u00b2", "", "0x10"])
def test_a_port_that_is_not_ascii_digits_is_refused_before_any_probe(cluster: Cluster, port: str) -> None:
    """Arabic-Indic digits are a port to int(), a superscript two is a digit to str.isdigit only."""
    c = cluster
    before = placement(c)
    for key in ("http", "raft"):
        node = {"id": "x", "http": "127.0.0.1:9", "raft": "127.0.0.1:10", key: f"127.0.0.1:{port}"}
        r = c.post("/v1/cluster/nodes", node)
        assert_error(r, 400, "bad_request")
        assert f"node {key} must be host:port" in r.json()["error"]["message"], r.text
    assert placement(c)["placement"] == before["placement"]


def test_a_proof_relayed_from_a_real_node_does_not_add_the_relay(cluster: Cluster) -> None:
    """The recorder passes the nonce on to n4 (running, not yet added) and returns n4's real
    answer, claiming n4's id and Raft address for its own http address: the proof names n4's own
    http address, so it is worthless for the relay's, and n4 is not added there."""
    c = cluster
    n4 = c.nodes["n4"]
    raft = f"127.0.0.1:{n4.raft_base}"
    before = placement(c)

    def relay(path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        r = requests.post(n4.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=10)
        return r.status_code, r.content

    with Recorder(relay) as recorder:
        r = c.post("/v1/cluster/nodes", {"id": "n4", "http": recorder.address, "raft": raft})
        assert_error(r, 400, "bad_request")
    assert len(recorder.requests) == 1 and b"/internal/proof" in recorder.requests[0], recorder.requests
    assert recorder.leaked() == [], recorder.requests
    after = placement(c)
    assert after["placement"] == before["placement"] and after["change"] is None


def test_the_proof_route_is_open_and_answers_only_a_proof_over_the_nonce(cluster: Cluster) -> None:
    """The route answers anyone (the prober sends no credential), so it names nothing: not the
    node's id, not its Raft address (a stranger would learn where to knock), only the proof, which
    the prober checks against the id and addresses it asked about."""
    n4 = cluster.nodes["n4"]
    nonce = "ab" * 32
    r = requests.post(n4.url + "/internal/proof", json={"nonce": nonce}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    raft = f"127.0.0.1:{n4.raft_base}"
    assert body == {"proof": node_proof(KEYS.peer, nonce, "n4", n4.http, raft)}
    for revealed in ("n4", raft, str(n4.raft_base)):
        assert revealed not in r.text, revealed
    assert not {v for v in CREDENTIALS.values() if v.lower() in r.text.lower()}
    for bad_body in ({"nonce": "short"}, {"nonce": 5}, {}, [1]):
        assert_error(requests.post(n4.url + "/internal/proof", json=bad_body, timeout=30), 400, "bad_request")


def test_each_key_opens_only_what_it_guards(cluster: Cluster) -> None:
    """The backup key opens the backup's three routes and nothing else; the peer key is accepted
    only as the peer key; the raw secret, the Raft key and the old header open nothing."""
    c = cluster

    def call(method: str, path: str, headers: dict[str, str], node: str = "n1") -> requests.Response:
        return requests.request(method, c.nodes[node].url + path, headers=headers, data=b"{}", timeout=30)

    backup = {BACKUP_HEADER: KEYS.backup}
    assert call("GET", "/internal/status", backup).status_code == 200

    # The barrier is the leader's (421 elsewhere): asked again if the leadership moved meanwhile.
    def barrier() -> int:
        return call("POST", "/internal/groups/meta/barrier", backup, c.wait_leader("meta")).status_code

    wait_until(lambda: barrier() == 200, 60, what="a barrier with the backup key at the metadata leader")
    r = call("GET", "/internal/groups/meta/checkpoint", backup)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/x-tar"
    for method, path in (
        ("GET", "/internal/groups/meta/digest"),
        ("GET", "/internal/placement"),
        ("GET", "/internal/topics"),
        ("POST", "/internal/groups/meta/compact"),
        ("POST", "/internal/groups/meta/transfer"),
        ("GET", "/v1/topics"),
        ("GET", "/v1/cluster"),
    ):
        assert_error(call(method, path, backup), 401, "unauthorized")
    assert call("GET", "/internal/groups/meta/digest", {PEER_HEADER: KEYS.peer}).status_code == 200
    refused = [
        {PEER_HEADER: KEYS.backup},
        {PEER_HEADER: KEYS.raft},
        {PEER_HEADER: SECRET},
        {BACKUP_HEADER: KEYS.peer},
        {LEGACY_HEADER: SECRET},
        {LEGACY_HEADER: SECRET, PEER_HEADER: KEYS.peer},  # the old header is refused outright
    ]
    for headers in refused:
        assert_error(call("GET", "/internal/status", headers), 401, "unauthorized")
        assert_error(call("GET", "/internal/groups/meta/digest", headers), 401, "unauthorized")
