"""What the producer's requests hold and what their answers mean (no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from ._accumulator import Batch, QueueKey
from .errors import RaftmqError, UnexpectedResponse

__all__ = ["frame_results", "in_requests", "offset_of", "refuses_binary", "resolve"]


def in_requests(
    batches: list[Batch],
    leader_of: Callable[[QueueKey], str | None] | None,
    max_bytes: int,
    max_messages: int,
) -> list[list[Batch]]:
    """The batches taken, in requests: those of one topic whose queues have the same leader
    share a request (one frame each), up to ``max_bytes`` and ``max_messages`` in all, so the
    node takes one request, and proposes one Raft entry per queue group, for them. Without
    ``leader_of``, one batch per request."""
    if leader_of is None:
        return [[b] for b in batches]
    by_node: dict[tuple[str, str | None], list[list[Batch]]] = {}
    for b in batches:
        requests = by_node.setdefault((b.topic, leader_of(b.key)), [])
        last = requests[-1] if requests else None
        if (
            last is not None
            and sum(x.size_bytes for x in last) + b.size_bytes <= max_bytes
            and sum(x.count for x in last) + b.count <= max_messages
        ):
            last.append(b)
        else:
            requests.append([b])
    return [request for requests in by_node.values() for request in requests]


def offset_of(value: Any) -> int:
    """An offset of a produce answer. None is passed on: only the test-only fault
    ``ack_before_replication`` answers before an offset exists (the chaos suite's mutation test
    must still see those messages acknowledged)."""
    return cast(int, value) if value is None else int(value)


def refuses_binary(e: RaftmqError) -> bool:
    """A node that does not know the binary format: 415, or (older nodes) a JSON parse error of
    the batch. Either certainly stored nothing."""
    return e.code == "invalid_json" or 415 in (e.status, e.details.get("status"))


def frame_results(
    answer: Any, error: RaftmqError | None, frames: int
) -> tuple[list[Any], RaftmqError | None]:
    """A request of ``frames`` frames: one result per frame (None: not acknowledged), from its
    ``answer`` or its ``error`` (whose ``results`` say what was stored), and the error of the
    frames not acknowledged (an answer that does not fit acknowledges none)."""
    results = (error.details if error is not None else answer if isinstance(answer, dict) else {}).get(
        "results"
    )
    if isinstance(results, list) and len(results) == frames:
        return results, error
    unfit = UnexpectedResponse(f"produce answer {answer!r:.200} does not fit {frames} frames")
    return [None] * frames, error or unfit


def resolve(b: Batch, answer: Any, binary: bool) -> None:
    """Complete ``b``'s outcome from the answer that stored it: one result per frame (binary,
    ``{"queue", "base_offset", "count"[, "duplicate"]}``) or per message (JSON); an answer that
    does not fit the batch fails it with UnexpectedResponse."""
    results = answer.get("results") if isinstance(answer, dict) else None
    try:
        if binary:
            (r,) = results  # type: ignore[misc]
            if r["count"] != b.count or "delayed" in r:
                raise ValueError(f"count {r['count']}")
            b.outcome.resolve(int(r["queue"]), offset_of(r["base_offset"]))
            return
        if not isinstance(results, list) or len(results) != b.count:
            raise ValueError(f"{b.count} messages")
        offsets = [offset_of(r["offset"]) for r in results]
        b.outcome.resolve(int(results[0]["queue"]), offsets[0], offsets)
    except (TypeError, ValueError, KeyError):
        error = f"produce answer {answer!r:.200} does not fit a batch of {b.count}"
        b.outcome.fail(UnexpectedResponse(error))
