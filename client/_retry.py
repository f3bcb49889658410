"""Retrying: exponential backoff with jitter, and the rule for which failures may be retried."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import RaftmqError, UnknownOutcome

__all__ = ["Backoff", "may_retry", "outcome_error", "retrying"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays ``initial_ms * 2**attempt``, capped at ``max_ms``, each scaled by a random factor in
    [0.5, 1] so that clients failed by one event do not retry in step."""

    initial_ms: int = 50
    max_ms: int = 2_000

    def delay_s(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        base: float = min(self.max_ms, self.initial_ms * (2 ** min(attempt, 30)))
        return base * (0.5 + 0.5 * rand()) / 1000


def may_retry(error: RaftmqError, idempotent: bool) -> bool:
    """A failed request may be sent again: the error is retriable and either nothing happened
    (``definite``) or sending it twice is harmless (``idempotent``)."""
    return error.retriable and (error.definite or idempotent)


def outcome_error(final: RaftmqError, indefinite: RaftmqError | None) -> RaftmqError:
    """The error to report after the last attempt failed with ``final``.

    If an earlier attempt's outcome was unknown (``indefinite``), the request may have happened even
    though the last attempt failed definitely: report that uncertainty, not the last error.
    """
    if final.definite and indefinite is not None:
        return UnknownOutcome(
            f"an earlier attempt's outcome is unknown ({indefinite.code}: {indefinite.message}); "
            f"the last attempt failed with {final.code}: {final.message}",
            final.details,
        )
    return final


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    idempotent: bool,
    timeout_ms: int,
    backoff: Backoff,
    on_error: Callable[[RaftmqError], None] | None = None,
) -> T:
    """``await call()`` until it succeeds, a failure may not be retried, or ``timeout_ms`` passed.

    Raises:
        RaftmqError: The last failure (see :func:`outcome_error`).
    """
    deadline = time.monotonic() + timeout_ms / 1000
    indefinite: RaftmqError | None = None
    attempt = 0
    while True:
        try:
            return await call()
        except RaftmqError as e:
            if not e.definite:
                indefinite = e
            if on_error is not None:
                on_error(e)
            delay = backoff.delay_s(attempt)
            if not may_retry(e, idempotent) or time.monotonic() + delay > deadline:
                reported = outcome_error(e, indefinite)
                if reported is e:
                    raise
                raise reported from e
            attempt += 1
            await asyncio.sleep(delay)
