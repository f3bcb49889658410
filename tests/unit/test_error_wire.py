"""One converter each way between an error and a wire answer (issue 20): the API's error middleware
answers any catalogued error with its body and status, and the client's ``error_from_body`` turns
that answer back into the class of its code, with the same code, status, flags, message and fields.
Each error goes through the real middleware and the client's real answer parser."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftmq import errors as shared
from raftmq.client import errors as client
from raftmq.client._transport import _parse
from raftmq.cluster.api.common import error_middleware
from raftmq.cluster.base import errors as server
from raftmq.cluster.config.cluster_file import ConfigError
from raftmq.storage.store import StoreError


def _answer(error: BaseException) -> web.Response:
    """The answer of the error middleware to a handler that raises ``error``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        raise error

    async def run() -> web.StreamResponse:
        return await error_middleware(make_mocked_request("POST", "/v1/topics/t/messages"), handler)

    response = asyncio.run(run())
    assert isinstance(response, web.Response) and isinstance(response.body, bytes)
    return response


def _round_trip(error: BaseException) -> shared.RaftmqError:
    response = _answer(error)
    with pytest.raises(shared.RaftmqError) as caught:
        _parse(response.status, response.body)  # type: ignore[arg-type]
    assert caught.value.status == response.status
    return caught.value


@pytest.mark.parametrize("code", sorted(server.BY_CODE))
@pytest.mark.parametrize("kind", [server.ApiError, server.Refused, server.ProduceFailed, server.BadCommand])
def test_every_catalogued_code_round_trips_with_its_fields(
    code: str, kind: type[server.CatalogError]
) -> None:
    entry = server.BY_CODE[code]
    sent = kind(entry, f"{code} happened", queue=3, leader="n2")
    got = _round_trip(sent)
    assert type(got) is client.BY_CODE[code]
    assert (got.code, got.status, got.retriable, got.definite) == (
        entry.code,
        entry.status,
        entry.retriable,
        entry.definite,
    )
    assert got.message == sent.message == f"{code} happened"
    assert dict(got.details) == dict(sent.details) == {"queue": 3, "leader": "n2"}
    assert got.body() == sent.body()


def test_storage_offset_out_of_range_is_answered_and_read_back_with_its_bounds() -> None:
    got = _round_trip(shared.OffsetOutOfRange(12, 5, 9))
    assert isinstance(got, client.OffsetOutOfRange)
    assert (got.status, got.low_offset, got.high_offset) == (416, 5, 9)
    assert got.message == "offset 12 is outside [5, 9]"


def test_a_bad_batch_is_answered_and_read_back_with_where_it_is_bad() -> None:
    got = _round_trip(shared.BadBatch("crc_mismatch", "the batch's CRC does not match", 4, 1))
    assert isinstance(got, client.BadBatch)
    assert (got.status, got.reason, got.record, got.batch) == (400, "crc_mismatch", 4, 1)


@pytest.mark.parametrize(
    "error",
    [ConfigError(["secret=hunter2 is too short"]), StoreError("/var/lib/raftmq/n1 is corrupt")],
)
def test_an_error_that_is_no_answer_is_a_500_internal_without_its_message(error: Exception) -> None:
    assert isinstance(error, shared.RaftmqError) and error.status == 0
    response = _answer(error)
    assert response.status == 500
    assert b"hunter2" not in response.body and b"corrupt" not in response.body  # type: ignore[operator]
    got = _round_trip(error)
    assert isinstance(got, client.InternalError)


@pytest.mark.parametrize("code", sorted(server.BY_CODE))
def test_an_error_result_converts_back_to_the_same_error(code: str) -> None:
    # What a state machine's result or another node's answer carries, back into a server error
    # (router.propose_checked, router.body_error, the SQS API): entry, message and fields kept.
    result = server.error_body(server.BY_CODE[code], "refused", lease_until_ms=7)["error"]
    e = server.ApiError.from_body(result)
    assert e.error is server.BY_CODE[code]
    assert (e.message, dict(e.details)) == ("refused", {"lease_until_ms": 7})
    assert e.body() == {"error": result}


def test_an_error_result_of_an_unknown_code_is_the_fallback_entry() -> None:
    e = server.ApiError.from_body({"code": "teapot", "message": "short and stout", "spout": 1})
    assert (e.error, e.message, dict(e.details)) == (server.INTERNAL, "short and stout", {"spout": 1})
    assert server.ApiError.from_body({"code": 5}, server.UNKNOWN_OUTCOME).error is server.UNKNOWN_OUTCOME


def _every_error() -> list[shared.RaftmqError]:
    made: list[shared.RaftmqError] = [
        server.ApiError(server.LOCK_HELD, "held", lease_until_ms=9),
        shared.BadBatch("truncated", "short", 2, 0),
        shared.OffsetOutOfRange(7, 1, 3),
        StoreError("gone"),
    ]
    made += [
        cls.from_wire("m", {"field": 1}) for cls in [*client.BY_CODE.values(), *client.CLIENT_CODES.values()]
    ]
    return made


@pytest.mark.parametrize("error", _every_error(), ids=repr)
def test_an_error_pickles_with_its_class_message_and_fields(error: shared.RaftmqError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert (back.message, dict(back.details), back.code, back.status) == (
        error.message,
        dict(error.details),
        error.code,
        error.status,
    )
    assert back.body() == error.body() and str(back) == str(error)
