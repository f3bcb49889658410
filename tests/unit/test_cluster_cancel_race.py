"""``DELETE /v1/cluster/change`` when the change it read ends before its cancel entry applies: the
metadata machine refuses the cancel (that change is no longer the one in progress). The answer is
409 ``no_change_in_progress`` (not retriable) whether or not another change began meanwhile: one
that did is named and left running. ``change_in_progress`` there (retriable in the catalogue)
would have a client retry the cancel and cancel the new change it never read. A real metadata
machine under a stand-in node and router, whose proposal lets the race's entries apply first."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request
from metadata_log import Meta
from test_placement import config

from raftmq.cluster.api.handlers.cluster import ClusterApi
from raftmq.cluster.base.errors import ApiError, CatalogError
from raftmq.cluster.machines.placement import static_placement

ADD = {"kind": "add_node", "node": {"id": "n4", "http": "127.0.0.1:8004", "raft": "127.0.0.1:7400"}}


class RacingRouter:
    """Leads the metadata group; a proposal first applies ``before`` (the race), then itself."""

    def __init__(self, meta: Meta, before: list[dict[str, Any]]) -> None:
        self.meta, self.before = meta, before

    def leads(self, name: str) -> bool:
        return True

    async def propose_checked(self, name: str, command: bytes) -> dict[str, Any]:
        for cmd in self.before:
            assert "error" not in self.meta.apply(**cmd)
        result = self.meta.apply(**orjson.loads(command))
        if "error" in result:
            raise CatalogError.from_body(result["error"])
        return result


def _cancel(meta: Meta, before: list[dict[str, Any]]) -> ApiError:
    router = RacingRouter(meta, before)
    node = SimpleNamespace(metadata=meta.machine)
    handlers = ClusterApi(node, SimpleNamespace(router=router))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as refused:
        asyncio.run(handlers.cancel(make_mocked_request("DELETE", "/v1/cluster/change")))
    return refused.value


def _meta_with_a_change() -> tuple[Meta, int]:
    meta = Meta()
    assert meta("init_placement", placement=static_placement(config(3)).to_json())["created"]
    begun = meta("begin_change", now_ms=5, change=ADD)
    return meta, int(begun["change"]["id"])


def test_a_cancel_whose_change_ended_meanwhile_answers_nothing_in_progress() -> None:
    meta, change_id = _meta_with_a_change()
    ended = {"op": "end_change", "change_id": change_id, "outcome": "done", "now_ms": 6}
    refused = _cancel(meta, [ended])
    assert (refused.error.code, refused.error.status) == ("no_change_in_progress", 409), refused


def test_a_cancel_whose_change_another_replaced_meanwhile_answers_not_retriable() -> None:
    meta, change_id = _meta_with_a_change()
    ended = {"op": "end_change", "change_id": change_id, "outcome": "failed", "now_ms": 6}
    other = {"kind": "transfer_leader", "group": "0", "target": "n2"}
    refused = _cancel(meta, [ended, {"op": "begin_change", "now_ms": 7, "change": other}])
    assert (refused.error.code, refused.error.status) == ("no_change_in_progress", 409), refused
    assert not refused.error.retriable  # a client following the catalogue does not cancel again
    running = meta.machine.change()
    assert running is not None and running.id != change_id and not running.cancel  # left to run
    assert f"change {running.id} (transfer_leader)" in refused.message, refused.message
    assert "left as is" in refused.message, refused.message
