"""Admin.set_topic_retention sends only the bounds it is given (client/_admin.py): one left out
keeps its value, None removes it, as PATCH /v1/topics/{topic} takes them; neither sends nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from raftmq.client import AsyncAdmin


class Recording:
    def __init__(self) -> None:
        self.changes: list[tuple[str, dict[str, Any]]] = []

    async def change_topic(self, name: str, change: Mapping[str, Any]) -> str:
        self.changes.append((name, dict(change)))
        return "described"


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ({"retention_ms": 60_000}, {"retention_ms": 60_000}),
        ({"retention_bytes": None}, {"retention_bytes": None}),
        (
            {"retention_ms": None, "retention_bytes": 1 << 20},
            {"retention_ms": None, "retention_bytes": 1 << 20},
        ),
    ],
)
def test_set_topic_retention_sends_the_bounds_given_and_no_other(
    given: dict[str, Any], sent: dict[str, Any]
) -> None:
    admin = AsyncAdmin("http://127.0.0.1:1")
    api = admin._api = Recording()  # type: ignore[assignment]
    assert asyncio.run(admin.set_topic_retention("orders", **given)) == "described"
    assert api.changes == [("orders", sent)]


def test_set_topic_retention_without_a_bound_is_refused_before_anything_is_sent() -> None:
    admin = AsyncAdmin("http://127.0.0.1:1")
    api = admin._api = Recording()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="retention_ms or retention_bytes"):
        asyncio.run(admin.set_topic_retention("orders"))
    assert api.changes == []
