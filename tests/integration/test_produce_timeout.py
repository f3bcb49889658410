"""A produce whose entry cannot commit (the group's followers are gone) is answered ``timeout``
(504, retriable, not definite) after ``request_timeout_ms``, on both wires, and the leader goes on
serving: once a follower is back, the same request is acknowledged."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from raftmq import batch as rb

from .conftest import assert_error
from .harness import wait_until
from .test_replication import start

pytestmark = pytest.mark.timeout(300)

# The leader cut off from its followers keeps leading for 20 s (longer than the test needs it);
# proposals time out after 1 s.
TOML = "[raft]\nleader_fallback_ms = 20000\n[limits]\nrequest_timeout_ms = 1000\n"


def binary_body() -> bytes:
    b = rb.BatchBuilder()
    b.append(b"v", key="k")
    return rb.join_frames([(0, None, b.finish())])


def test_an_entry_that_cannot_commit_is_answered_timeout_and_the_leader_goes_on(tmp_path: Path) -> None:
    with start(tmp_path, extra_toml=TOML) as c:
        c.create_topic("t", queues=1)
        leader = c.wait_leader("0")
        url = f"{c.url(leader)}/v1/topics/t/messages"
        binary = {"data": binary_body(), "headers": {"Content-Type": rb.BATCH_MEDIA_TYPE}}
        assert requests.post(url, **binary, timeout=30).status_code == 200
        followers = [n for n in c.nodes if n != leader]
        for nid in followers:
            c.kill(nid)
        for wire in ("binary", "json"):
            began = time.monotonic()
            if wire == "binary":
                r = requests.post(url, **binary, timeout=30)
            else:
                r = requests.post(url, json={"messages": [{"value": "v", "key": "k"}]}, timeout=30)
            took = time.monotonic() - began
            assert_error(r, 504, "timeout")
            assert 1.0 <= took < 10.0, (wire, took)
        c.start(followers[0])
        wait_until(lambda: requests.post(url, **binary, timeout=30).status_code == 200, 60)
        r = requests.post(url, json={"messages": [{"value": "after", "key": "k"}]}, timeout=30)
        assert r.status_code == 200, r.text
