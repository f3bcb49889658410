"""``raftmq produce|consume`` (the Python client, raftmq.client) and ``raftmq receive``,
``raftmq dlq list|redrive`` and ``raftmq subscription set`` (receive/ack, dead letters and their
settings; the work is in cli/delivery.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import click

from raftmq.cluster.cli.common import client_command, client_security, write_all
from raftmq.cluster.cli.progress import (
    Tally,
    output_options,
    plural,
    progress,
    summary,
    value_bytes,
    wants_progress,
)


def _parse_input_line(
    raw: bytes, fmt: str, key_field: str | None, number: int
) -> tuple[str | bytes, str | None]:
    """The (value, key) of one input line (its line break removed); ``number`` is its 1-based line
    number for errors. A line that is not UTF-8 is sent as a binary value (format ``lines``)."""
    body = raw.removesuffix(b"\n").removesuffix(b"\r")
    try:
        line = body.decode()
    except UnicodeDecodeError:
        if fmt == "lines":
            return body, None
        raise click.ClickException(f"line {number} is not UTF-8") from None
    if fmt == "lines":
        return line, None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise click.ClickException(f"line {number} is not JSON: {e}") from None
    key: str | None = None
    if key_field is not None:
        if not isinstance(record, dict):
            raise click.ClickException(f"line {number} is not a JSON object (--key-field {key_field})")
        found = record.get(key_field)
        if found is not None:
            key = found if isinstance(found, str) else json.dumps(found, separators=(",", ":"))
    return line, key


@click.command()
@click.argument("topic")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Read the messages from this file (default: stdin).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["lines", "jsonl"]),
    default="lines",
    show_default=True,
    help="lines: each line is a message. jsonl: each line is a JSON value, sent as it is (checked).",
)
@click.option("--key-field", help="jsonl: the field of each JSON object whose value is the message's key.")
@click.option(
    "--linger-ms",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Batching delay (0: a batch waits only for its queue's batch in flight).",
)
@output_options
@client_command
def produce(
    urls: list[str],
    topic: str,
    path: str | None,
    fmt: str,
    key_field: str | None,
    linger_ms: int,
    quiet: bool,
    as_json: bool,
) -> None:
    """Produce each line of stdin or a file as one message to TOPIC.

    Idempotent (a retried batch is stored once). The input is streamed: memory stays flat however
    long it is. On a terminal a progress line on stderr shows the messages stored and messages/s;
    the final summary goes to stderr. Exit status 1 if any message could not be stored.
    """
    from raftmq.client import Producer, RaftmqError

    if key_field is not None and fmt != "jsonl":
        raise click.UsageError("--key-field needs --format jsonl")
    tally = Tally("produced")
    stream = sys.stdin.buffer if path in (None, "-") else open(path, "rb")  # noqa: SIM115
    total = os.fstat(stream.fileno()).st_size if path not in (None, "-") else None
    sent = read_bytes = 0
    outcome = _Outcome(tally)

    def read() -> str:
        done = f"{read_bytes / total:.0%} of {path}, " if total else ""
        return f"({done}{sent:,} sent)"

    interrupted = False
    with (
        stream,
        Producer(urls, linger_ms=linger_ms, **client_security()) as producer,
        progress(tally, f"producing to {topic}", wants_progress(quiet, as_json), read),
    ):
        try:
            for number, raw in enumerate(stream, 1):
                read_bytes += len(raw)
                value, key = _parse_input_line(raw, fmt, key_field, number)
                # The value's bytes: the line without its line break (as _parse_input_line has it).
                size = len(raw) - raw.endswith(b"\n") - raw.endswith(b"\r\n")
                producer.send(topic, value, key=key, callback=_Stored(outcome, size))
                sent += 1
        except KeyboardInterrupt:
            interrupted = True
        producer.flush()
    summary(tally, quiet=quiet, as_json=as_json, failed=outcome.failed)
    if outcome.failed:
        error: RaftmqError = outcome.first_error
        click.echo(
            f"{plural(outcome.failed)} not stored; first error {error.code}: {error.message}", err=True
        )
        sys.exit(1)
    if interrupted:
        click.echo("interrupted: stopped reading the input", err=True)
        sys.exit(130)


class _Outcome:
    """The produce's stored and failed messages (delivery callbacks run on the producer's thread)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.failed = 0
        self.first_error: Any = None


class _Stored:
    """One message's delivery callback: small, as a million of them may wait in the buffer."""

    __slots__ = ("outcome", "size")

    def __init__(self, outcome: _Outcome, size: int) -> None:
        self.outcome = outcome
        self.size = size

    def __call__(self, meta: Any, error: Any) -> None:
        if error is None:
            self.outcome.tally.add(1, self.size)
        else:
            self.outcome.failed += 1
            if self.outcome.first_error is None:
                self.outcome.first_error = error


# Options of the commands that print messages as JSON lines (consume, receive).
_max_option = click.option(
    "--max", "max_messages", type=click.IntRange(min=1), help="Stop after this many messages."
)
_output_option = click.option(
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write the JSON lines to this file (appended) instead of stdout.",
)


def _output(path: str | None) -> Any:
    return sys.stdout.buffer if path in (None, "-") else open(path, "ab")


def _message_json(m: Any) -> bytes:
    """One consumed message as a JSON line (binary values as ``value_b64``)."""
    import base64

    import orjson

    item: dict[str, Any] = {"offset": m.offset, "queue": m.queue, "key": m.key}
    if isinstance(m.value, bytes):
        item["value_b64"] = base64.b64encode(m.value).decode()
    else:
        item["value"] = m.value
    item["headers"] = dict(m.headers)
    item["timestamp_ms"] = m.timestamp_ms
    return orjson.dumps(item) + b"\n"


@click.command()
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group (its committed progress).")
@click.option(
    "--broadcast",
    is_flag=True,
    help="Read every queue with this consumer's own progress (committed as GROUP.MEMBER_ID) "
    "instead of sharing the queues with the group's other consumers.",
)
@click.option(
    "--member-id",
    help="This consumer's id in the group (broadcast: default the host name; clustering: random).",
)
@click.option(
    "--from",
    "reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where to start a queue the group has no committed offset for.",
)
@click.option(
    "--from-beginning",
    "from_beginning",
    is_flag=True,
    help="Same as --from earliest (Kafka's console consumer's spelling).",
)
@_max_option
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    help="Stop when no message arrived for this long (default: wait for more until Ctrl-C).",
)
@_output_option
@output_options
@client_command
def consume(
    urls: list[str],
    topic: str,
    group: str,
    broadcast: bool,
    member_id: str | None,
    reset: str,
    from_beginning: bool,
    max_messages: int | None,
    timeout_ms: int | None,
    output: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Consume TOPIC as a member of GROUP, printing each message as a JSON line.

    Each line holds offset, queue, key, value (value_b64 for a binary value), headers and
    timestamp_ms. A message is acked once written; the group's offsets are committed every
    second and on exit (also after Ctrl-C), so the next run of the group continues after it.
    A progress line on stderr when it is a terminal and the messages go elsewhere; the final
    summary on stderr.
    """
    from raftmq.client import Consumer

    tally = Tally("consumed")
    if from_beginning:
        reset = "earliest"
    if broadcast and member_id is None:
        member_id = socket.gethostname()
    out = _output(output)
    consumer = Consumer(
        urls,
        **client_security(),
        group=group,
        topics=topic,
        mode="broadcast" if broadcast else "clustering",
        member_id=member_id,
        reset="earliest" if reset == "earliest" else "latest",
        max_batch=500,  # a dump wants large fetches (the client's default is the design's 32)
    )
    last_at: float | None = None
    interrupted = False
    with (
        _ctrl_c_between_batches() as batch_done,
        progress(tally, f"consuming {topic}", wants_progress(quiet, as_json, out)),
    ):
        try:
            while max_messages is None or tally.count < max_messages:
                want = 10_000 if max_messages is None else min(10_000, max_messages - tally.count)
                batch = consumer.poll(timeout_ms=timeout_ms, max_messages=want)
                if not batch:
                    break
                with batch_done:  # a Ctrl-C now is taken once the batch is written and acked
                    lines = [_message_json(m) for m in batch]
                    write_all(out, b"".join(lines))
                    out.flush()
                    for m in batch:
                        m.ack()
                    tally.add(len(batch), sum(value_bytes(m.value) for m in batch))
                    last_at = time.monotonic()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            try:
                consumer.close()  # commits what was written
            finally:
                if out is not sys.stdout.buffer:
                    out.close()
    if timeout_ms is not None and last_at is not None and not interrupted:
        tally.ended = last_at  # up to the last message, not the idle --timeout-ms wait after it
    summary(tally, quiet=quiet, as_json=as_json)
    if interrupted:
        sys.exit(130)


class _Deferred:
    """While entered, a Ctrl-C is remembered instead of raised; leaving raises it."""

    def __init__(self) -> None:
        self.inside = False
        self.pending = False

    def __enter__(self) -> None:
        self.inside = True

    def __exit__(self, *exc: object) -> None:
        self.inside = False
        if self.pending and exc[0] is None:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _ctrl_c_between_batches() -> Iterator[_Deferred]:
    """Ctrl-C while a consumed (or received) batch is written and acked takes effect once it is:
    otherwise messages already written would be left unacked, and the next run of the group would
    write them again. A second Ctrl-C stops at once (an ack can wait for an unavailable cluster)."""
    deferred = _Deferred()

    def on_sigint(signum: int, frame: object) -> None:
        if deferred.inside and not deferred.pending:
            deferred.pending = True
        else:  # between batches, or a second Ctrl-C: stop now
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield deferred
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGINT, previous)


# -- receive/ack and dead letters (the work is in cli/delivery.py) -------------------------------


@click.command()
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group (its subscription to TOPIC).")
@_max_option
@click.option(
    "--visibility-ms",
    type=click.IntRange(min=1),
    help="How long each message stays in flight (default: the cluster's, 30 s).",
)
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help=(
        "Ack each message once written. --no-ack leaves it in flight: it comes back when its"
        " visibility timeout ends (its deadline; no backoff on top: that is for nacks)."
    ),
)
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for messages (until Ctrl-C or --max).")
@click.option(
    "--wait-ms",
    type=click.IntRange(min=0, max=15_000),
    default=1_000,
    show_default=True,
    help="How long one receive waits; without --follow, stop after a wait that brought nothing.",
)
@_output_option
@output_options
@client_command
def receive(
    urls: list[str],
    topic: str,
    group: str,
    max_messages: int | None,
    visibility_ms: int | None,
    ack: bool,
    follow: bool,
    wait_ms: int,
    output: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Receive messages of TOPIC for GROUP (receive/ack), printing each as a JSON line.

    Each line holds receipt, attempt, queue, offset, deadline_ms, key, value (value_b64 for a
    binary value), headers and timestamp_ms. Exit status 0 when done, 1 on an error, 130 after
    Ctrl-C, which takes effect once the batch being written is acked (a second Ctrl-C stops at
    once: messages written but not acked come back after their deadline). A progress line on
    stderr when it is a terminal and the messages go elsewhere; the final summary on stderr.
    """
    from raftmq.cluster.cli.delivery import ReceiveOptions
    from raftmq.cluster.cli.delivery import receive as run

    tally = Tally("received")
    options = ReceiveOptions(topic, group, max_messages, visibility_ms, ack, follow, wait_ms)
    out = _output(output)
    try:
        with (
            _ctrl_c_between_batches() as batch_done,
            progress(tally, f"receiving {topic}", wants_progress(quiet, as_json, out)),
        ):
            done = run(urls, client_security(), options, out, batch_done, tally.add)
    except KeyboardInterrupt:
        summary(tally, quiet=quiet, as_json=as_json)
        click.echo("interrupted", err=True)
        sys.exit(130)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    summary(tally, quiet=quiet, as_json=as_json, stale_acks=done.stale)
    if done.stale:
        click.echo(f"{plural(done.stale, 'ack')} came too late (the messages were redelivered)", err=True)


@click.group()
def dlq() -> None:
    """Dead letters of a consumer group: TOPIC.GROUP.dlq."""


@dlq.command("list")
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group whose dead letters to list.")
@click.option(
    "--max",
    "max_messages",
    type=click.IntRange(min=1, max=10_000),
    default=100,
    show_default=True,
    help="At most this many dead letters.",
)
@click.option("--queue", type=click.IntRange(min=0), help="Only this queue.")
@client_command
def dlq_list(urls: list[str], topic: str, group: str, max_messages: int, queue: int | None) -> None:
    """Print the dead letters of GROUP on TOPIC not yet redriven, one JSON line each (queue,
    offset, key, value, headers with their raftmq-dlq-* history, timestamp_ms); a summary per
    queue on stderr."""
    from raftmq.cluster.cli.delivery import dead_letter_line
    from raftmq.cluster.cli.delivery import dlq_list as run

    answer = run(urls, client_security(), topic, group, max_messages, queue)
    if answer.get("subscribed") is False:
        click.echo(
            f"error: group {group!r} has no subscription to {topic!r} (no offsets, no receive/ack "
            f"state, no dead-letter topic {answer['dead_letter_topic']})",
            err=True,
        )
        sys.exit(1)
    for m in answer["messages"]:
        write_all(sys.stdout.buffer, dead_letter_line(m))
    sys.stdout.buffer.flush()
    waiting = sum(q["high_offset"] - q["redrive_offset"] for q in answer["queues"])
    click.echo(f"{answer['dead_letter_topic']}: {plural(waiting, 'dead letter')} not redriven", err=True)


@dlq.command("redrive")
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group whose dead letters to move back.")
@click.option(
    "--max",
    "max_messages",
    type=click.IntRange(min=1, max=10_000),
    default=1_000,
    show_default=True,
    help="Per queue and request.",
)
@click.option("--queue", type=click.IntRange(min=0), help="Only this queue.")
@click.option("--all", "until_empty", is_flag=True, help="Repeat until no dead letter is left.")
@client_command
def dlq_redrive(
    urls: list[str], topic: str, group: str, max_messages: int, queue: int | None, until_empty: bool
) -> None:
    """Move dead letters of GROUP back to TOPIC as new messages for GROUP only (header
    raftmq-redrive-group). Prints each answer as a JSON line; the total on stderr."""
    from raftmq.cluster.cli.delivery import dlq_redrive as run

    answers = run(urls, client_security(), topic, group, max_messages, queue, until_empty)
    for answer in answers:
        click.echo(json.dumps(answer, separators=(",", ":")))
    total = sum(a["redriven"] for a in answers)
    more = " (more left: run again or use --all)" if answers[-1]["more"] else ""
    click.echo(f"redrove {plural(total, 'dead letter')} to {topic}{more}", err=True)


def _delays(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """``10000,30000,60000`` -> [10000, 30000, 60000] (the route checks the range)."""
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter("comma-separated delays in milliseconds, e.g. 1000,5000,30000") from None


@click.group()
def subscription() -> None:
    """Settings of a consumer group's receive/ack subscription to a topic."""


@subscription.command("set")
@click.argument("topic")
@click.option("--group", required=True, help="The consumer group whose settings to set.")
@click.option(
    "--max-deliveries",
    type=click.IntRange(min=1),
    help="Deliveries of a message before it moves to the dead-letter topic TOPIC.GROUP.dlq.",
)
@click.option(
    "--backoff-ms",
    callback=_delays,
    metavar="MS[,MS...]",
    help=(
        "Delay before the retry of a nacked message, per attempt (the last repeating), e.g."
        " 1000,5000,30000. An expired message comes back at its deadline regardless."
    ),
)
@client_command
def subscription_set(
    urls: list[str], topic: str, group: str, max_deliveries: int | None, backoff_ms: list[int] | None
) -> None:
    """Set GROUP's max deliveries and retry backoff on TOPIC (creating its dead-letter topic).
    An option not given is set to the cluster's default ([delivery] in the cluster file); with
    neither, both are reset. Prints the stored settings as a JSON line."""
    from raftmq.client import Admin

    with Admin(urls, **client_security()) as admin:
        stored = admin.set_subscription(topic, group, max_deliveries=max_deliveries, backoff_ms=backoff_ms)
    click.echo(
        json.dumps(
            dataclasses.asdict(stored) | {"backoff_ms": list(stored.backoff_ms)}, separators=(",", ":")
        )
    )
