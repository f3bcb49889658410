"""What a caught error becomes when it is passed on to a client (a receive's waiters, a push
stream, per-item results): never an answer of status 0, never definite for a write it may have
done; a catalogued error goes as it is."""

from __future__ import annotations

import pytest

from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError, answerable
from raftmq.storage.store import StoreClosed, StoreError


def test_a_catalogued_error_goes_as_it_is() -> None:
    e = ApiError(errors.TOPIC_NOT_FOUND, "topic 'x' does not exist", topic="x")
    assert answerable(e, write=True) is e


@pytest.mark.parametrize(
    ("write", "code", "definite"), [(False, "unavailable", True), (True, "unknown_outcome", False)]
)
def test_a_store_closed_under_the_request_is_a_retriable_503(write: bool, code: str, definite: bool) -> None:
    e = answerable(StoreClosed("store is closed"), write=write)
    assert (e.status, e.code, e.retriable, e.definite) == (503, code, True, definite)
    assert e.body()["error"]["code"] == code


def test_any_other_error_that_is_no_answer_is_a_500_internal_without_its_detail() -> None:
    e = answerable(StoreError("disk says EIO at /data/n1/db/000123.sst"), write=True)
    assert (e.status, e.code, e.definite) == (500, "internal", False)
    assert "000123" not in str(e.body())
