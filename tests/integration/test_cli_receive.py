"""``raftmq receive`` and ``raftmq dlq list|redrive`` against a real 3-node cluster (short backoff and
max_deliveries = 2 from the cluster file): JSON lines out, acks, dead letters round trip, errors
and exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import Cluster, ctrl_c_mid_write, wait_until

pytestmark = pytest.mark.timeout(180)

DELIVERY = "[delivery]\nmax_deliveries = 2\nbackoff_ms = [100]\ntick_ms = 100\n"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cli-receive"), extra_toml=DELIVERY) as cluster:
        cluster.start()
        cluster.wait_ready()
        yield cluster


def raftmq(c: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"}
    env["RAFTMQ_URL"] = " ".join(c.url(n) for n in c.nodes)
    return subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def produce(c: Cluster, topic: str, values: list[str]) -> None:
    r = c.produce(topic, [{"value": v, "queue": i % 2} for i, v in enumerate(values)])
    assert r.status_code == 200, r.text


def receive_http(c: Cluster, topic: str, group: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"/v1/topics/{topic}/subscriptions/{group}/receive", {"wait_ms": 0, **body})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def test_receive_prints_json_lines_acks_them_and_stops_at_max_or_when_idle(c: Cluster) -> None:
    c.create_topic("orders", queues=2)
    produce(c, "orders", [f"order {i}" for i in range(7)])
    first = raftmq(c, "receive", "orders", "--group", "billing", "--max", "4")
    assert first.returncode == 0, first.stderr
    got = lines(first.stdout)
    assert len(got) == 4 and "received 4 messages" in first.stderr
    assert set(got[0]) == {
        "receipt",
        "attempt",
        "queue",
        "offset",
        "deadline_ms",
        "key",
        "value",
        "headers",
        "timestamp_ms",
    }
    rest = raftmq(c, "receive", "orders", "--group", "billing", "--wait-ms", "300")
    assert rest.returncode == 0, rest.stderr
    values = [m["value"] for m in got + lines(rest.stdout)]
    assert sorted(values) == sorted(f"order {i}" for i in range(7))  # each once: all were acked
    assert {m["attempt"] for m in got + lines(rest.stdout)} == {1}
    assert receive_http(c, "orders", "billing", wait_ms=300) == []


def test_no_ack_leaves_messages_in_flight_until_their_deadline(c: Cluster) -> None:
    c.create_topic("peek", queues=2)
    produce(c, "peek", ["a", "b"])
    # A visibility that outlasts the CLI's exit and the check below on a slow machine too.
    peek = raftmq(c, "receive", "peek", "--group", "g", "--no-ack", "--visibility-ms", "4000", "--max", "2")
    assert peek.returncode == 0, peek.stderr
    assert sorted(m["value"] for m in lines(peek.stdout)) == ["a", "b"]
    assert receive_http(c, "peek", "g") == []  # in flight
    again = raftmq(c, "receive", "peek", "--group", "g", "--wait-ms", "15000", "--max", "2")
    assert again.returncode == 0, again.stderr
    assert [m["attempt"] for m in lines(again.stdout)] == [2, 2]


def test_follow_waits_for_messages_produced_later(c: Cluster) -> None:
    c.create_topic("later", queues=2)
    env = {**os.environ, "RAFTMQ_URL": c.url("n2")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq.cluster.cli.main", "receive", "later", "--group", "g", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(2.5)  # longer than a receive's wait: --follow keeps waiting
        assert proc.poll() is None
        produce(c, "later", ["x", "y"])
        assert proc.stdout is not None
        got = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert sorted(m["value"] for m in got) == ["x", "y"]
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    wait_until(lambda: receive_http(c, "later", "g", wait_ms=200) == [], 30, what="acked")


def test_dead_letters_are_listed_and_redriven_back_to_the_group(c: Cluster) -> None:
    c.create_topic("payments", queues=2)
    produce(c, "payments", ["poison-1", "poison-2"])
    # A worker that never acks: each delivery expires (--no-ack, short visibility), twice each.
    # The second delivery is due about 300 ms after the first; the receive stops when idle for
    # --wait-ms, which must outlast that on a slow machine too.
    peek = raftmq(
        c, "receive", "payments", "--group", "w", "--no-ack", "--visibility-ms", "200", "--wait-ms", "5000"
    )
    assert peek.returncode == 0, peek.stderr
    assert sorted(m["attempt"] for m in lines(peek.stdout)) == [1, 1, 2, 2]

    def listed() -> list[dict[str, Any]]:
        out = raftmq(c, "dlq", "list", "payments", "--group", "w")
        assert out.returncode == 0, out.stderr
        assert "payments.w.dlq:" in out.stderr
        return lines(out.stdout)

    def two_dead() -> list[dict[str, Any]] | None:
        dead = listed()
        return dead if len(dead) == 2 else None

    dead = wait_until(two_dead, 30, what="two dead letters")
    assert sorted(m["value"] for m in dead) == ["poison-1", "poison-2"]
    assert {m["headers"]["raftmq-dlq-attempts"] for m in dead} == {"2"}
    assert {m["headers"]["raftmq-dlq-reason"] for m in dead} == {"expired"}

    redrive = raftmq(c, "dlq", "redrive", "payments", "--group", "w", "--all")
    assert redrive.returncode == 0, redrive.stderr
    (answer,) = lines(redrive.stdout)
    assert answer["redriven"] == 2 and not answer["more"] and "redrove 2 dead letters" in redrive.stderr
    assert listed() == []  # nothing left to redrive
    back = raftmq(c, "receive", "payments", "--group", "w", "--wait-ms", "3000")
    assert back.returncode == 0, back.stderr
    got = lines(back.stdout)
    assert sorted(m["value"] for m in got) == ["poison-1", "poison-2"]
    assert {m["attempt"] for m in got} == {1} and {m["headers"]["raftmq-redrive-group"] for m in got} == {"w"}


def test_errors_are_one_line_on_stderr_with_exit_status_1_and_usage_errors_2(c: Cluster) -> None:
    missing = raftmq(c, "receive", "no-such-topic", "--group", "g")
    assert missing.returncode == 1 and missing.stderr.strip().startswith("error topic_not_found:"), (
        missing.stderr
    )
    bad_group = raftmq(c, "dlq", "list", "orders", "--group", "bad group!")
    assert bad_group.returncode == 1 and "error bad_request:" in bad_group.stderr, bad_group.stderr
    usage = raftmq(c, "receive", "orders", "--group", "g", "--max", "0")
    assert usage.returncode == 2, usage.stderr
    no_group = raftmq(c, "dlq", "redrive", "orders")
    assert no_group.returncode == 2 and "--group" in no_group.stderr


def test_ctrl_c_takes_effect_once_the_batch_written_is_acked(c: Cluster) -> None:
    """A Ctrl-C while a batch is being written is held until the batch is written and acked: no
    message it wrote comes back. The receiver writes to a pipe nobody reads yet, so it is blocked
    in the middle of its first batch (far more than a pipe holds) when the Ctrl-C comes. Whatever
    it received but did not write comes back after its deadline: the two parts are every message,
    each once."""
    c.create_topic("interrupted", queues=2)
    sent = [f"{k:05d}" + "x" * 200 for k in range(3000)]  # 1,000 per receive: about 250 KB a batch
    for start in range(0, len(sent), 500):
        produce(c, "interrupted", sent[start : start + 500])
    env = {**os.environ, "RAFTMQ_URL": " ".join(c.url(n) for n in c.nodes)}
    status, out, stderr = ctrl_c_mid_write(
        ["receive", "interrupted", "--group", "g", "--visibility-ms", "15000"], env
    )
    assert status == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert out.endswith(b"\n"), (out[-200:], stderr)  # whole lines: the batch was not cut off
    written = [m["value"] for m in lines(out.decode())]
    assert written and len(set(written)) == len(written)
    rest: list[str] = []
    deadline = time.monotonic() + 90
    while len(written) + len(rest) < len(sent) and time.monotonic() < deadline:
        batch = receive_http(c, "interrupted", "g", max=1000, wait_ms=1000)
        if batch:
            r = c.post(
                "/v1/topics/interrupted/subscriptions/g/ack", {"receipts": [m["receipt"] for m in batch]}
            )
            assert r.status_code == 200 and all(x["ok"] for x in r.json()["results"]), r.text
        rest += [m["value"] for m in batch]
    assert not set(written) & set(rest), "messages written before the Ctrl-C came back: not acked"
    assert sorted(written + rest) == sorted(sent)


# -- subscription settings from Python and the command line (issue 21, item 5) ----------------


def _nack_once(c: Cluster, topic: str, group: str) -> dict[str, Any]:
    (m,) = receive_http(c, topic, group, max=1, wait_ms=5000)
    r = c.post(f"/v1/topics/{topic}/subscriptions/{group}/nack", {"receipts": [m["receipt"]]})
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["results"][0]
    return result


def test_the_admin_client_sets_a_groups_max_deliveries_and_backoff_sync_and_asyncio(c: Cluster) -> None:
    import asyncio

    from raftmq.client import Admin, AsyncAdmin, BadRequest, SubscriptionSettings, TopicNotFound

    c.create_topic("settings", queues=2)
    produce(c, "settings", ["x"])
    urls = [c.url(n) for n in c.nodes]
    with Admin(urls) as admin:
        stored = admin.set_subscription("settings", "one", max_deliveries=1, backoff_ms=[50, 100])
        assert stored == SubscriptionSettings("settings", "one", "settings.one.dlq", 1, (50, 100))
        with pytest.raises(BadRequest):
            admin.set_subscription("settings", "one", max_deliveries=0)
        with pytest.raises(BadRequest):
            admin.set_subscription("settings", "one", backoff_ms=[])
        with pytest.raises(TopicNotFound):
            admin.set_subscription("nowhere", "one", max_deliveries=3)
    # One delivery allowed (the cluster's default is 2): the first nack makes it a dead letter,
    # so the refused settings above changed nothing.
    assert _nack_once(c, "settings", "one").get("dead_lettered") is True

    async def set_async() -> SubscriptionSettings:
        async with AsyncAdmin(urls) as admin:
            return await admin.set_subscription("settings", "three", max_deliveries=3)

    # An option left out is the cluster's default ([delivery] backoff_ms = [100] here).
    assert asyncio.run(set_async()) == SubscriptionSettings(
        "settings", "three", "settings.three.dlq", 3, (100,)
    )
    for _ in range(2):
        assert _nack_once(c, "settings", "three").get("dead_lettered") is None
    assert _nack_once(c, "settings", "three").get("dead_lettered") is True


def test_raftmq_subscription_set_sets_the_settings_and_refuses_bad_ones(c: Cluster) -> None:
    c.create_topic("cli-settings", queues=2)
    produce(c, "cli-settings", ["x"])
    done = raftmq(
        c,
        "subscription",
        "set",
        "cli-settings",
        "--group",
        "g",
        "--max-deliveries",
        "1",
        "--backoff-ms",
        "50,100",
    )
    assert done.returncode == 0, done.stderr
    assert lines(done.stdout) == [
        {
            "topic": "cli-settings",
            "group": "g",
            "dead_letter_topic": "cli-settings.g.dlq",
            "max_deliveries": 1,
            "backoff_ms": [50, 100],
        }
    ]
    assert _nack_once(c, "cli-settings", "g").get("dead_lettered") is True
    bad = raftmq(c, "subscription", "set", "cli-settings", "--group", "g", "--backoff-ms", "1s,2s")
    assert bad.returncode == 2 and "comma-separated delays" in bad.stderr, bad.stderr
    bad = raftmq(c, "subscription", "set", "cli-settings", "--group", "g", "--backoff-ms", "-5")
    assert bad.returncode == 1 and "error bad_request" in bad.stderr, bad.stderr
    missing = raftmq(c, "subscription", "set", "nowhere", "--group", "g", "--max-deliveries", "2")
    assert missing.returncode == 1 and "error topic_not_found" in missing.stderr, missing.stderr
