"""The broker's limits that the client checks its settings against, so that a setting the
broker would refuse fails at once, in the constructor (the API's limits: docs/api-reference.md)."""

from __future__ import annotations

__all__ = ["MAX_MESSAGES", "MAX_NAME_BYTES", "MAX_WAIT_MS", "check_concurrency"]

MAX_MESSAGES = 10_000
"""Most messages in one produce request, fetch or receive (and push credit); most receipts in
one settle request or frame."""
MAX_WAIT_MS = 15_000
"""The longest long poll of a fetch or receive (the broker's default ``max_wait_ms``)."""
MAX_NAME_BYTES = 255
"""Longest consumer group name and member id, in UTF-8 bytes."""


def check_concurrency(concurrency: int) -> None:
    """The ``concurrency`` of a consumer's ``run`` (sync or asyncio)."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
