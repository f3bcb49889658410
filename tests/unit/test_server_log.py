"""aiohttp's server log (cluster/api/server_log.py): malformed requests counted, everything else logged."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, InvalidURLError
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from raftmq.cluster.api.metrics import METRICS_KEY
from raftmq.cluster.api.server_log import MalformedRequests, server_logger


def record(exc: BaseException | None) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request", (), info)


def counter() -> Counter:
    return Counter("malformed", "m", registry=CollectorRegistry())


def test_parser_refusals_are_counted_and_summed_up_once_a_minute() -> None:
    now = [100.0]
    c = counter()
    f = MalformedRequests(c, every_s=60, clock=lambda: now[0])
    with capture_logs() as logged:
        assert f.filter(record(BadHttpMessage("bad header"))) is False
        for _ in range(9):
            now[0] += 1
            assert f.filter(record(InvalidURLError("bad url"))) is False
        now[0] = 161.0
        assert f.filter(record(BadHttpMessage("again"))) is False
    assert c._value.get() == 11
    assert [(e["event"], e["refused"], e["last_kind"]) for e in logged] == [
        ("malformed_http_requests", 1, "BadHttpMessage"),
        ("malformed_http_requests", 10, "BadHttpMessage"),
    ]
    assert "bad header" not in repr(logged)  # what the client sent is not logged


def test_everything_else_aiohttp_logs_passes() -> None:
    c = counter()
    f = MalformedRequests(c)
    try:
        raise ValueError("a handler's bug")
    except ValueError:
        bug = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "m", (), sys.exc_info())
    assert f.filter(bug) is True
    assert f.filter(record(None)) is True
    assert c._value.get() == 0


def test_the_logger_is_aiohttp_servers_own_per_application() -> None:
    apps = [web.Application(), web.Application()]
    for app in apps:
        app[METRICS_KEY] = SimpleNamespace(malformed=counter())  # type: ignore[assignment]
    a, b = server_logger(apps[0]), server_logger(apps[1])
    assert a is not b and a.name == "aiohttp.server"
    assert a.parent is logging.getLogger("aiohttp.server")  # handled (and levelled) as before
    assert len(a.filters) == 1 and not logging.getLogger("aiohttp.server").filters
