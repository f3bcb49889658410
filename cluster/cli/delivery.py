"""The work of ``raftmq receive`` and ``raftmq dlq list|redrive`` (declared in ``cli/messages.py``):
receive/ack and dead letters over the HTTP API, through the Python client's transport (failover
to the next node, retries of retriable errors). Output is JSON lines on stdout.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from raftmq.cluster.cli.common import write_all
from raftmq.cluster.cli.progress import value_bytes

__all__ = [
    "ReceiveOptions",
    "Received",
    "dead_letter_line",
    "dlq_list",
    "dlq_redrive",
    "receive",
    "received_line",
    "received_value_bytes",
    "report_failed_acks",
]


@dataclass(frozen=True)
class ReceiveOptions:
    topic: str
    group: str
    max_messages: int | None
    visibility_ms: int | None
    ack: bool
    follow: bool
    wait_ms: int


@dataclass
class Received:
    count: int = 0
    size: int = 0
    stale: int = 0  # acks refused as stale_receipt (the message had been redelivered meanwhile)
    failed: Counter[str] = field(default_factory=Counter)  # acks refused otherwise, by error code
    seconds: float = 0.0


def _client(urls: list[str], security: Mapping[str, Any]) -> Any:
    from raftmq.client.lowlevel import ApiClient, Backoff, Transport

    transport = Transport(urls, token=security.get("token"), ca_file=security.get("ca_file"))
    return ApiClient(transport, retry_timeout_ms=30_000, backoff=Backoff(100, 2_000))


def _path(topic: str, group: str) -> str:
    from raftmq.client.lowlevel import path_part

    return f"/v1/topics/{path_part(topic)}/subscriptions/{path_part(group)}"


def received_value_bytes(m: Mapping[str, Any]) -> int:
    """The bytes of a received message's value as stored (the summary counts these, as produce
    and consume do: cli/progress.py)."""
    if "value_b64" in m:
        encoded: str = m["value_b64"]
        return len(encoded) * 3 // 4 - encoded.count("=", -2)
    return value_bytes(m["value"])


def received_line(m: Mapping[str, Any]) -> bytes:
    """One received message as a JSON line (the API's fields; binary values as ``value_b64``)."""
    keys = ("receipt", "attempt", "queue", "offset", "deadline_ms", "key", "value", "value_b64")
    item = {k: m[k] for k in keys if k in m}
    item["headers"] = m.get("headers") or {}
    item["timestamp_ms"] = m.get("timestamp_ms")
    return orjson.dumps(item) + b"\n"


def receive(
    urls: list[str],
    security: Mapping[str, Any],
    options: ReceiveOptions,
    out: IO[bytes],
    batch_guard: AbstractContextManager[Any] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> Received:
    """Receive (and ack, unless ``options.ack`` is False) until ``max_messages``, or until a receive
    waited ``wait_ms`` for nothing (unless ``follow``). Acks refused other than as stale are
    reported on stderr. Each batch is written, acked and counted inside ``batch_guard`` (the CLI's
    holds a Ctrl-C until the batch is acked), then reported as ``on_batch(messages, bytes)``."""
    done = asyncio.run(_receive(urls, security, options, out, batch_guard, on_batch))
    report_failed_acks(done)
    return done


def report_failed_acks(done: Received) -> None:
    """A line on stderr if acks were refused other than as stale (their messages come back)."""
    if done.failed:
        codes = ", ".join(f"{code}: {n:,}" for code, n in sorted(done.failed.items()))
        print(
            f"{done.failed.total():,} ack{'' if done.failed.total() == 1 else 's'} failed ({codes}); "
            "those messages are delivered again at "
            "their deadline",
            file=sys.stderr,
        )


async def _receive(
    urls: list[str],
    security: Mapping[str, Any],
    options: ReceiveOptions,
    out: IO[bytes],
    batch_guard: AbstractContextManager[Any] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> Received:
    api = _client(urls, security)
    path = _path(options.topic, options.group)
    body: dict[str, Any] = {"wait_ms": options.wait_ms}
    if options.visibility_ms is not None:
        body["visibility_ms"] = options.visibility_ms
    done = Received()
    started = time.monotonic()
    try:
        while options.max_messages is None or done.count < options.max_messages:
            want = 1_000 if options.max_messages is None else min(1_000, options.max_messages - done.count)
            # A repeated receive is harmless (what a lost answer handed out comes back later).
            answer = await api.call("POST", path + "/receive", body={**body, "max": want}, idempotent=True)
            messages = answer["messages"]
            if not messages:
                if options.follow:
                    continue
                break
            with batch_guard or nullcontext():
                lines = [received_line(m) for m in messages]
                write_all(out, b"".join(lines))
                out.flush()
                if options.ack:  # after writing: a message is acked only once it is out
                    receipts = [m["receipt"] for m in messages]
                    results = (
                        await api.call("POST", path + "/ack", body={"receipts": receipts}, idempotent=True)
                    )["results"]
                    for r in results:
                        if not r.get("ok"):
                            code = (r.get("error") or {}).get("code", "unknown")
                            if code == "stale_receipt":
                                done.stale += 1
                            else:
                                done.failed[code] += 1
                size = sum(received_value_bytes(m) for m in messages)
                done.count += len(messages)
                done.size += size
                done.seconds = time.monotonic() - started
                if on_batch is not None:
                    on_batch(len(messages), size)
    finally:
        await api.transport.close()
    return done


def dlq_list(
    urls: list[str], security: Mapping[str, Any], topic: str, group: str, max_messages: int, queue: int | None
) -> dict[str, Any]:
    """The dead letters not yet redriven (``GET .../dlq``); the messages are written by the caller.
    Without a dead-letter topic, ``subscribed`` tells whether GROUP has any state on TOPIC (offsets
    or receive/ack: ``GET /v1/topics/{topic}/groups``)."""

    async def run() -> dict[str, Any]:
        api = _client(urls, security)
        params: dict[str, str | int] = {"max": max_messages}
        if queue is not None:
            params["queue"] = queue
        try:
            answer: dict[str, Any] = await api.call(
                "GET", _path(topic, group) + "/dlq", params=params, idempotent=True
            )
            if not answer["queues"]:  # no dead-letter topic: is there a subscription at all?
                groups = await api.call(
                    "GET", _path(topic, group).split("/subscriptions/")[0] + "/groups", idempotent=True
                )
                answer["subscribed"] = any(g["group"] == group for g in groups["groups"])
            return answer
        finally:
            await api.transport.close()

    return asyncio.run(run())


def dead_letter_line(m: Mapping[str, Any]) -> bytes:
    """One dead letter as a JSON line, as the API gives it (its ``raftmq-dlq-*`` headers tell its
    history)."""
    return orjson.dumps(m) + b"\n"


def dlq_redrive(
    urls: list[str],
    security: Mapping[str, Any],
    topic: str,
    group: str,
    max_messages: int,
    queue: int | None,
    until_empty: bool,
) -> list[dict[str, Any]]:
    """Redrive (``POST .../dlq/redrive``) once, or until nothing is left (``until_empty``); the
    answers in order."""

    async def run() -> list[dict[str, Any]]:
        api = _client(urls, security)
        body: dict[str, Any] = {"max": max_messages}
        if queue is not None:
            body["queue"] = queue
        answers: list[dict[str, Any]] = []
        try:
            while True:
                # Not idempotent (a repeat would move the next ones too): an unknown outcome is
                # reported, never resent.
                answer = await api.call(
                    "POST", _path(topic, group) + "/dlq/redrive", body=body, idempotent=False
                )
                answers.append(answer)
                if not (until_empty and answer["more"]):
                    return answers
        finally:
            await api.transport.close()

    return asyncio.run(run())
