"""aiohttp's server log without a line per malformed request.

aiohttp answers a request its parser cannot read (a bad header, a bad URL, broken chunking) with a
400 and logs the parser's exception with a traceback at ERROR, one line per request, before any
credential is looked at: anyone who reaches the port could write the node's log at about twenty
bytes of log per byte sent. The node's HTTP server logs through :func:`server_logger` instead:
such refusals are counted (``raftmq_http_malformed_requests_total``) and summed up in one
``malformed_http_requests`` warning a minute at most; everything else aiohttp logs (a handler's
unexpected error, above all) goes on as before. (What is not HTTP at all, TLS or another protocol
on the port, aiohttp answers 400 and logs at debug only, as the first request of a connection: not
counted.)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import Counter

from raftmq.cluster.api.metrics import METRICS_KEY

__all__ = ["MalformedRequests", "server_logger"]

log = structlog.get_logger(__name__)

SUMMARY_EVERY_S = 60.0


class MalformedRequests(logging.Filter):
    """Drops aiohttp's record of each request its parser refused (a 4xx), counting it instead."""

    def __init__(
        self, counter: Counter, every_s: float = SUMMARY_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._counter = counter
        self._every_s = every_s
        self._clock = clock
        self._last_summary = -math.inf
        self._since_summary = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or not 400 <= (exc.code or 0) < 500:
            return True
        self._counter.inc()
        self._since_summary += 1
        now = self._clock()
        if now - self._last_summary >= self._every_s:
            # The kind only: the parser's message quotes what the client sent.
            log.warning(
                "malformed_http_requests",
                refused=self._since_summary,
                last_kind=type(exc).__name__,
                every_s=self._every_s,
            )
            self._last_summary = now
            self._since_summary = 0
        return False


def server_logger(app: web.Application) -> logging.Logger:
    """A logger for the ``RequestHandler`` of the node's application ``app`` (``AppRunner(logger=...)``):
    named and handled as ``aiohttp.server``, with :class:`MalformedRequests` counting into the app's
    metrics. It is not registered by name, so two applications in one process each count their own."""
    logger = logging.Logger("aiohttp.server")
    logger.parent = logging.getLogger("aiohttp.server")
    logger.addFilter(MalformedRequests(app[METRICS_KEY].malformed))
    return logger
