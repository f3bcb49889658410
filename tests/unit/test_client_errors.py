"""The client's error classes mirror the API's error catalogue, code for code."""

from __future__ import annotations

import pytest

from raftmq import errors as shared
from raftmq.client import errors
from raftmq.client._retry import Backoff, may_retry, outcome_error
from raftmq.client._transport import _parse
from raftmq.cluster.base import errors as server


def test_every_server_code_has_a_class_with_the_same_flags() -> None:
    assert set(errors.BY_CODE) == set(server.BY_CODE)
    for code, entry in server.BY_CODE.items():
        cls = errors.BY_CODE[code]
        assert (cls.code, cls.status, cls.retriable, cls.definite) == (
            entry.code,
            entry.status,
            entry.retriable,
            entry.definite,
        ), code


def test_client_only_codes_never_collide_with_server_codes() -> None:
    assert not set(errors.CLIENT_CODES) & set(server.BY_CODE)
    for code, cls in errors.CLIENT_CODES.items():
        assert cls.code == code and cls.status == 0


def test_every_error_class_is_under_the_root_and_listed() -> None:
    # The client's own classes, and those it shares with the server (raftmq.errors: the root,
    # BadBatch, OffsetOutOfRange), which it exports as its own.
    classes = {
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ in (errors.__name__, shared.__name__)
    }
    assert {shared.RaftmqError, shared.BadBatch, shared.OffsetOutOfRange} <= classes
    assert all(issubclass(c, errors.RaftmqError) for c in classes)
    mapped = set(errors.BY_CODE.values()) | set(errors.CLIENT_CODES.values())
    assert classes - mapped == {errors.RaftmqError}
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    for c in classes:
        assert c.__name__ in errors.__all__
        assert c.__name__ in (errors.__doc__ or ""), f"{c.__name__} missing from the class tree"


@pytest.mark.parametrize("code", sorted(server.BY_CODE))
def test_an_error_body_maps_to_its_class(code: str) -> None:
    entry = server.BY_CODE[code]
    body = server.error_body(entry, "something happened", extra_field=1)
    with pytest.raises(errors.BY_CODE[code]) as info:
        _parse(entry.status, __import__("orjson").dumps(body))
    e = info.value
    assert e.message == "something happened"
    assert e.details == {"extra_field": 1}
    assert (e.retriable, e.definite) == (entry.retriable, entry.definite)


def test_offset_out_of_range_carries_the_bounds() -> None:
    body = server.error_body(server.OFFSET_OUT_OF_RANGE, "out", low_offset=5, high_offset=9)
    e = errors.error_from_body(416, body)
    assert isinstance(e, errors.OffsetOutOfRange)
    assert (e.low_offset, e.high_offset) == (5, 9)


def test_unknown_codes_and_foreign_bodies_are_unexpected_responses() -> None:
    e = errors.error_from_body(418, {"error": {"code": "teapot", "message": "short and stout"}})
    assert isinstance(e, errors.UnexpectedResponse) and e.details["code"] == "teapot"
    with pytest.raises(errors.UnexpectedResponse):
        _parse(502, b"<html>bad gateway</html>")
    with pytest.raises(errors.UnexpectedResponse):
        _parse(200, b"not json")
    assert _parse(200, b'{"ok": true}') == {"ok": True}


def test_connection_lost_is_a_connection_failure_with_an_unknown_outcome() -> None:
    assert issubclass(errors.ConnectionLost, errors.ConnectionFailed)
    assert errors.ConnectionFailed.definite and not errors.ConnectionLost.definite
    assert errors.ConnectionFailed.retriable and errors.ConnectionLost.retriable


def test_only_definite_failures_are_retried_without_idempotence() -> None:
    assert may_retry(errors.NotLeader(), idempotent=False)
    assert may_retry(errors.ConnectionFailed(), idempotent=False)
    assert not may_retry(errors.ConnectionLost(), idempotent=False)
    assert not may_retry(errors.Timeout(), idempotent=False)
    assert may_retry(errors.Timeout(), idempotent=True)
    assert not may_retry(errors.TopicNotFound(), idempotent=True)


def test_an_earlier_unknown_outcome_makes_a_later_definite_failure_unknown() -> None:
    final = errors.TopicNotFound("gone")
    assert outcome_error(final, None) is final
    reported = outcome_error(final, errors.ConnectionLost("reset"))
    assert isinstance(reported, errors.UnknownOutcome) and not reported.definite
    lost = errors.Timeout()
    assert outcome_error(lost, errors.ConnectionLost()) is lost


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    b = Backoff(initial_ms=100, max_ms=1_000)
    assert b.delay_s(0, rand=lambda: 1.0) == pytest.approx(0.1)
    assert b.delay_s(0, rand=lambda: 0.0) == pytest.approx(0.05)
    assert b.delay_s(3, rand=lambda: 1.0) == pytest.approx(0.8)
    assert b.delay_s(50, rand=lambda: 1.0) == pytest.approx(1.0)
