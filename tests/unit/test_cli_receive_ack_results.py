"""``raftmq receive`` counts refused acks by code: ``stale_receipt`` is a late ack (the message was
redelivered), any other code is an error reported on stderr (against a real aiohttp server that
answers the ack with one result of each)."""

from __future__ import annotations

import io

import pytest
from aiohttp import web
from fake_node import run, serve

from raftmq.cluster.cli import delivery as cli_delivery
from raftmq.cluster.cli.delivery import ReceiveOptions

PATH = "/v1/topics/t/subscriptions/g"
MESSAGES = [
    {"receipt": f"r{i}", "attempt": 1, "queue": 0, "offset": i, "deadline_ms": 0, "value": "v"}
    for i in range(3)
]


async def ack(request: web.Request) -> web.Response:
    r0, r1, r2 = (await request.json())["receipts"]
    error = {"code": "unavailable", "message": "no leader", "retriable": True}
    stale = {"code": "stale_receipt", "message": "redelivered", "retriable": False}
    return web.json_response(
        {
            "results": [
                {"receipt": r0, "ok": True},
                {"receipt": r1, "error": stale},
                {"receipt": r2, "error": error},
            ]
        }
    )


def test_refused_acks_are_counted_by_code_and_errors_reported(capsys: pytest.CaptureFixture[str]) -> None:
    receives = 0

    async def receive(request: web.Request) -> web.Response:
        nonlocal receives
        receives += 1  # the first receive gets the messages, the next none
        return web.json_response({"messages": MESSAGES if receives == 1 else []})

    async def main() -> cli_delivery.Received:
        options = ReceiveOptions("t", "g", None, None, ack=True, follow=False, wait_ms=0)
        async with serve(web.post(PATH + "/receive", receive), web.post(PATH + "/ack", ack)) as node:
            return await cli_delivery._receive([f"http://{node}"], {}, options, io.BytesIO())

    done = run(main())
    assert (done.count, done.stale, done.failed) == (3, 1, {"unavailable": 1})
    cli_delivery.report_failed_acks(done)
    assert "1 ack failed (unavailable: 1)" in capsys.readouterr().err
