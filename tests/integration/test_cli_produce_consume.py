"""``raftmq produce`` and ``raftmq consume``, run as real processes against a real 3-node cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.client import Admin

from .conftest import high_offsets, wait_applied_everywhere
from .harness import Cluster, ctrl_c_mid_write, wait_until

pytestmark = pytest.mark.timeout(180)


def raftmq(
    *args: str,
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 90,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; on a timeout, fail with the stuck process's Python stacks (py-spy) and stderr."""
    base = {k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, "COLUMNS": "120", **(env or {})},
        cwd=cwd,
    )
    try:
        stdout, stderr = proc.communicate(input or "", timeout=timeout)
    except subprocess.TimeoutExpired:
        spy = Path(sys.executable).parent / "py-spy"
        stacks = (
            subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True).stdout
            if spy.exists()
            else ""
        )
        proc.kill()
        _, stderr = proc.communicate()
        pytest.fail(f"raftmq {' '.join(args)} hung for {timeout} s\n{stacks}\nstderr:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cli-pc")) as c:
        c.start()
        c.wait_ready()
        yield c


def url_args(c: Cluster) -> list[str]:
    return [arg for n in c.nodes.values() for arg in ("--url", n.url)]


def create(c: Cluster, topic: str, queues: int = 4) -> None:
    with Admin([n.url for n in c.nodes.values()]) as admin:
        admin.create_topic(topic, queues)


def lines_of(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_produce_a_file_then_consume_it_with_a_group_then_broadcast(cluster: Cluster, tmp_path: Path) -> None:
    create(cluster, "cli-orders")
    source = tmp_path / "orders.txt"
    values = [f"order {i} " + "x" * (i % 50) for i in range(1_000)]
    source.write_text("\n".join(values) + "\n")

    produced = raftmq("produce", "cli-orders", "--file", str(source), *url_args(cluster))
    assert produced.returncode == 0, produced.stderr
    rate = re.search(
        r"produced 1,000 messages \(([\d.]+) MB\) in [\d.]+ s: ([\d,]+) messages/s, ", produced.stderr
    )
    assert rate, produced.stderr
    assert produced.stdout == ""  # the summary is on stderr, as for consume and receive
    # The values' bytes (the lines without their line breaks), as consume counts them below.
    value_mb = sum(len(v.encode()) for v in values) / 1e6
    assert float(rate.group(1)) == pytest.approx(value_mb, abs=0.005)

    # --max ends the run as soon as all are there; the idle timeout is only a safety net (a
    # short one would end a run early on a machine that stalls between two fetches).
    idle = ["--timeout-ms", "30000"]
    first = raftmq("consume", "cli-orders", "--group", "billing", "--max", "1000", *idle, *url_args(cluster))
    assert first.returncode == 0, first.stderr
    got = lines_of(first.stdout)
    assert sorted(m["value"] for m in got) == sorted(values)
    assert all(set(m) == {"offset", "queue", "key", "value", "headers", "timestamp_ms"} for m in got)
    assert len({(m["queue"], m["offset"]) for m in got}) == 1_000
    assert "consumed 1,000 messages" in first.stderr
    # The same figure as produce for the same messages (issue 21: 1.20 MB produced, 10.16 MB
    # consumed: consume counted its JSON lines).
    consumed = re.search(r"consumed 1,000 messages \(([\d.]+) MB\)", first.stderr)
    assert consumed and consumed.group(1) == rate.group(1), (first.stderr, produced.stderr)

    # The group's offsets were committed on exit: nothing new for it.
    again = raftmq("consume", "cli-orders", "--group", "billing", "--timeout-ms", "1000", *url_args(cluster))
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""
    with Admin([n.url for n in cluster.nodes.values()]) as admin:
        assert sum(o or 0 for o in admin.committed_offsets("billing", "cli-orders").values()) == 1_000

    # A broadcast consumer has its own progress (billing.<member>): it gets everything again.
    broadcast = raftmq(
        "consume",
        "cli-orders",
        "--group",
        "billing",
        "--broadcast",
        "--member-id",
        "audit",
        "--max",
        "1000",
        *idle,
        *url_args(cluster),
    )
    assert broadcast.returncode == 0, broadcast.stderr
    assert sorted(m["value"] for m in lines_of(broadcast.stdout)) == sorted(values)


def test_produce_jsonl_from_stdin_with_keys_and_consume_with_max_into_a_file(
    cluster: Cluster, tmp_path: Path
) -> None:
    create(cluster, "cli-events", 8)
    records = [{"user": f"u{i % 7}", "n": i} for i in range(200)]
    stdin = "".join(json.dumps(r) + "\n" for r in records)
    produced = raftmq(
        "produce",
        "cli-events",
        "--format",
        "jsonl",
        "--key-field",
        "user",
        "-q",
        input=stdin,
        env={"RAFTMQ_URL": ",".join(n.url for n in cluster.nodes.values())},
    )
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout == "" and produced.stderr == ""  # -q: no progress, no summary

    out = tmp_path / "events.jsonl"
    part = raftmq(
        "consume", "cli-events", "--group", "g", "--max", "150", "--output", str(out), *url_args(cluster)
    )
    assert part.returncode == 0, part.stderr
    first = lines_of(out.read_text())
    assert len(first) == 150
    rest = raftmq(
        "consume",
        "cli-events",
        "--group",
        "g",
        "--max",
        "50",
        "--timeout-ms",
        "30000",
        "--output",
        str(out),
        *url_args(cluster),
    )
    assert rest.returncode == 0, rest.stderr
    got = lines_of(out.read_text())
    by_value = {m["value"]: m for m in got}
    # Exactly where the first run stopped: the 150 were committed (a duplicate would leave one of
    # the 200 out).
    assert len(got) == len(by_value) == 200
    for r in records:
        m = by_value[json.dumps(r)]
        assert m["key"] == r["user"]
    queues_per_key = {k: {m["queue"] for m in got if m["key"] == k} for k in {m["key"] for m in got}}
    assert all(len(qs) == 1 for qs in queues_per_key.values())  # a key sticks to its queue


def test_bad_input_and_an_unknown_topic_are_one_line_errors(cluster: Cluster) -> None:
    missing = raftmq("produce", "no-such-topic", "-q", *url_args(cluster), input="a\n")
    assert missing.returncode == 1
    assert "topic_not_found" in missing.stderr and "Traceback" not in missing.stderr
    create(cluster, "cli-bad", 1)
    bad = raftmq(
        "produce", "cli-bad", "--format", "jsonl", "-q", *url_args(cluster), input='{"a": 1}\nnot json\n'
    )
    assert bad.returncode == 1 and "line 2 is not JSON" in bad.stderr
    usage = raftmq("produce", "cli-bad", "--key-field", "k", *url_args(cluster), input="")
    assert usage.returncode == 2 and "--format jsonl" in usage.stderr


def test_ctrl_c_stops_consuming_cleanly_and_commits(cluster: Cluster, tmp_path: Path) -> None:
    create(cluster, "cli-sigint", 2)
    produced = raftmq(
        "produce", "cli-sigint", "-q", *url_args(cluster), input="".join(f"m{i}\n" for i in range(300))
    )
    assert produced.returncode == 0, produced.stderr
    out = tmp_path / "sigint.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raftmq.cluster.cli.main",
            "consume",
            "cli-sigint",
            "--group",
            "int",
            "--output",
            str(out),
            *url_args(cluster),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) == 300, 30, what="consumed")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "consumed 300 messages" in stderr
    with Admin([n.url for n in cluster.nodes.values()]) as admin:
        assert sum(o or 0 for o in admin.committed_offsets("int", "cli-sigint").values()) == 300
    assert Counter(m["value"] for m in lines_of(out.read_text())) == Counter(f"m{i}" for i in range(300))


def test_ctrl_c_while_writing_to_a_full_pipe_writes_the_whole_batch_then_commits_it(cluster: Cluster) -> None:
    """consume writes to a pipe nobody reads yet: it blocks in the middle of a batch (far more
    than a pipe holds) when the Ctrl-C comes. The batch is still written whole and acked; what is
    committed on exit is exactly what was written, so the next run neither repeats nor skips."""
    create(cluster, "cli-pipe", 2)
    sent = [f"{k:05d}" + "x" * 200 for k in range(3000)]
    produced = raftmq("produce", "cli-pipe", "-q", *url_args(cluster), input="".join(v + "\n" for v in sent))
    assert produced.returncode == 0, produced.stderr
    status, out, stderr = ctrl_c_mid_write(["consume", "cli-pipe", "--group", "pipe", *url_args(cluster)])
    assert status == 130, stderr
    assert "Traceback" not in stderr and out.endswith(b"\n"), (out[-200:], stderr)
    written = [m["value"] for m in lines_of(out.decode())]
    assert len(set(written)) == len(written) and set(written) <= set(sent)
    assert f"consumed {len(written):,} messages" in stderr, stderr
    with Admin([n.url for n in cluster.nodes.values()]) as admin:
        committed = sum(o or 0 for o in admin.committed_offsets("pipe", "cli-pipe").values())
    assert committed == len(written) > 0, (committed, len(written))


@pytest.mark.parametrize("source", ["cli", "client"])
def test_300000_unkeyed_messages_spread_evenly_over_4_queues(cluster: Cluster, source: str) -> None:
    """Issue 15: unkeyed messages (uniform sticky batches) land no queue above 1/N + 10% (of 1/N)
    of a run of 300,000 small messages, from ``raftmq produce`` and from the Python client (before:
    89-100% in one queue)."""
    from raftmq.client import Producer

    topic = f"spread-{source}"
    create(cluster, topic, queues=4)
    total = 300_000
    if source == "cli":
        done = raftmq(
            "produce",
            topic,
            "-q",
            *url_args(cluster),
            input="".join(f"{i}\n" for i in range(total)),
            timeout=170,
        )
        assert done.returncode == 0, done.stderr
    else:
        with Producer([n.url for n in cluster.nodes.values()]) as producer:
            for i in range(total):
                producer.send(topic, str(i))
    wait_applied_everywhere(cluster, topic)  # the node answering may follow some groups a little behind
    counts = high_offsets(cluster, topic)
    assert sum(counts) == total
    assert max(counts) <= total / 4 * 1.10, counts


def test_the_elapsed_time_counts_from_the_process_start(cluster: Cluster) -> None:
    """The summary's time is the command's, as ``time`` counts it: a consume of one waiting message
    said "in 0.36 s" after 1.27 s, the interpreter's start and imports left out. Here a 1.5 s pause
    before the CLI runs stands for a slow start; each summary counts it."""
    create(cluster, "cli-start")
    produced = raftmq("produce", "cli-start", "-q", *url_args(cluster), input="a\nb\n")
    assert produced.returncode == 0, produced.stderr
    slow_start = "import sys, time; time.sleep(1.5); from raftmq.cluster.cli.main import main; main()"
    env = {k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"}
    for command in (
        ["consume", "cli-start", "--group", "g", "--max", "1"],
        ["receive", "cli-start", "--group", "r", "--max", "1"],
        ["produce", "cli-start"],
    ):
        done = subprocess.run(
            [sys.executable, "-c", slow_start, *command, "--json", *url_args(cluster)],
            input="c\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=90,
        )
        assert done.returncode == 0, (command, done.stderr)
        assert json.loads(done.stderr)["seconds"] >= 1.5, (command, done.stderr)


def test_summaries_go_to_stderr_with_counts_plurals_and_the_real_elapsed_time(cluster: Cluster) -> None:
    """Issue 15: produce, consume and receive print their final line on stderr ("1 message", the
    time since the command started), --json prints it as one JSON object, -q prints none; stdout
    holds only the messages; nothing is lost."""
    create(cluster, "cli-summary")
    urls = url_args(cluster)
    one = raftmq("produce", "cli-summary", *urls, input="only\n")
    assert one.returncode == 0 and one.stdout == "", one
    assert re.fullmatch(
        r"produced 1 message \(0\.00 MB\) in [\d.]+ s: [\d,]+ messages?/s, [\d.]+ MB/s\n", one.stderr
    )

    many = raftmq("produce", "cli-summary", "--json", *urls, input="".join(f"m{i}\n" for i in range(999)))
    assert many.returncode == 0 and many.stdout == "", many
    summary = json.loads(many.stderr)
    assert summary["produced"] == 999 and summary["failed"] == 0 and summary["seconds"] > 0, summary
    value_bytes = sum(len(f"m{i}") for i in range(999))  # the values, not the input lines
    assert summary["bytes"] == value_bytes

    quiet = raftmq("consume", "cli-summary", "--group", "q", "--max", "1000", "-q", *urls)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert sorted(m["value"] for m in lines_of(quiet.stdout)) == sorted(
        ["only", *(f"m{i}" for i in range(999))]
    )

    as_json = raftmq("receive", "cli-summary", "--group", "r", "--max", "1000", "--json", *urls)
    assert as_json.returncode == 0, as_json.stderr
    assert len(lines_of(as_json.stdout)) == 1000
    assert json.loads(as_json.stderr)["received"] == 1000
    assert json.loads(as_json.stderr)["bytes"] == value_bytes + len("only")  # as produce counted

    # A consumer that waits for its one message: the summary counts the wait (it said "1 messages
    # in 0.00 s" after 2.4 s). The message is produced 2 s after the consumer started.
    create(cluster, "cli-late")
    started = time.monotonic()  # before the process starts: its summary counts from its start
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raftmq.cluster.cli.main",
            "consume",
            "cli-late",
            "--group",
            "g",
            "--max",
            "1",
            *urls,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"},
    )
    try:
        time.sleep(2.0)
        late = raftmq("produce", "cli-late", "-q", *urls, input="late\n")
        assert late.returncode == 0, late.stderr
        out, err = proc.communicate(timeout=60)
        waited = time.monotonic() - started
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert [m["value"] for m in lines_of(out)] == ["late"]
    line = re.fullmatch(r"consumed 1 message \(0\.00 MB\) in ([\d.]+) s: .*\n", err)
    assert line, err
    assert 2.0 <= float(line.group(1)) <= waited, (err, waited)

    received = raftmq("receive", "cli-late", "--group", "one", "--max", "1", *urls)
    assert received.returncode == 0 and re.fullmatch(r"received 1 message \(.*\n", received.stderr), received


def _stderr_on_a_terminal(args: list[str], stdin: bytes) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout and stdin pipes); its exit status and
    everything it drew there."""
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env={**{k: v for k, v in os.environ.items() if k != "RAFTMQ_URL"}, "COLUMNS": "160", "TERM": "xterm"},
    )
    os.close(slave)
    drawn = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the process closed the terminal
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert proc.stdin is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    status = proc.wait(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    return status, drawn.decode(errors="replace")


def test_progress_is_drawn_on_a_terminal_only(cluster: Cluster) -> None:
    """On a terminal, produce draws the messages stored so far and messages/s, then its summary;
    piped, stderr holds the summary alone (the other tests)."""
    create(cluster, "cli-tty")
    status, drawn = _stderr_on_a_terminal(
        ["produce", "cli-tty", *url_args(cluster)], "".join(f"{i}\n" for i in range(100_000)).encode()
    )
    assert status == 0, drawn[-2000:]
    assert re.search(
        r"producing to cli-tty: [\d,]+ messages? produced \([\d,]+ sent\), [\d,]+ messages/s", drawn
    )
    assert "produced 100,000 messages (" in drawn, drawn[-2000:]
    assert sum(high_offsets(cluster, "cli-tty")) == 100_000
