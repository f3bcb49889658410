"""One fetch path for three wires (``cluster/api/handlers/fetch_core.py``): the encoder is picked by
``Accept`` as before (Arrow first, then record batches, else JSON), each keeps its own defaults
and maximum, and the steps every answer shares (forwarding, the long poll, the bounds, the metric,
writing) are written once. The answers themselves are proved by the integration tests
(test_api.py, test_binary_fetch.py, test_segments.py, test_fetch_large.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from raftmq.batch import BATCH_MEDIA_TYPE
from raftmq.cluster.api.handlers.fetch import ENCODERS
from raftmq.cluster.api.handlers.fetch_arrow import ARROW, ARROW_STREAM
from raftmq.cluster.api.handlers.fetch_batches import BATCH_HEADERS, BATCHES
from raftmq.cluster.api.handlers.fetch_core import POSITION_HEADERS, FetchBounds, encoder_for
from raftmq.cluster.api.handlers.fetch_json import JSON
from raftmq.cluster.api.validation import DEFAULT_FETCH_BYTES
from raftmq.cluster.config.cluster_file import Limits

API = Path(__file__).resolve().parents[2] / "cluster" / "api"


@pytest.mark.parametrize(
    ("accept", "encoder"),
    [
        (None, JSON),
        ("application/json", JSON),
        ("*/*", JSON),
        (BATCH_MEDIA_TYPE, BATCHES),
        (ARROW_STREAM, ARROW),
        (f"{BATCH_MEDIA_TYPE}, {ARROW_STREAM}", ARROW),  # Arrow was asked for first, as before
        (f"application/json;q=0.5, {BATCH_MEDIA_TYPE}", BATCHES),
    ],
)
def test_the_encoder_is_picked_by_accept(accept: str | None, encoder: object) -> None:
    headers = {} if accept is None else {"Accept": accept}
    request = make_mocked_request("GET", "/v1/topics/t/queues/0/messages", headers=headers)
    assert encoder_for(request, ENCODERS, JSON) is encoder


def test_each_encoder_keeps_its_bounds_and_forwarded_headers() -> None:
    limits = Limits(default_fetch_messages=7, max_fetch_messages=70)
    assert JSON.bounds(limits) == BATCHES.bounds(limits) == FetchBounds(7, 70, DEFAULT_FETCH_BYTES)
    assert ARROW.bounds(limits) == FetchBounds(65_536, 65_536, 32 * 1024 * 1024)
    assert (JSON.media_type, JSON.headers) == ("application/json", ())
    assert BATCHES.headers == BATCH_HEADERS and BATCH_HEADERS[:3] == POSITION_HEADERS
    assert ARROW.headers == POSITION_HEADERS
    assert (JSON.in_executor, BATCHES.in_executor, ARROW.in_executor) == (False, False, True)


def _calls(path: Path) -> list[str]:
    """The names called in a module (``f(...)`` and ``x.f(...)`` alike)."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            out.append(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
    return out


def test_the_steps_every_fetch_answer_shares_are_written_once() -> None:
    modules = [*sorted(API.glob("handlers/fetch*.py")), API / "handlers/segments.py"]
    found: dict[str, list[str]] = {}
    for path in modules:
        for name in _calls(path):
            if name in ("forward", "forward_to", "long_poll", "queue_bounds", "fetch_query", "write_parts"):
                found.setdefault(name, []).append(path.name)
    assert found["forward"] == ["fetch_core.py"], found  # one forwarding call for three wires
    assert found["long_poll"] == ["fetch_core.py"], found
    assert found["fetch_query"] == ["fetch_core.py"], found
    assert found["queue_bounds"] == ["fetch_core.py"], found
    assert found["write_parts"] == ["fetch_core.py"], found
    assert found["forward_to"] == ["segments.py"], found  # a segment file, from the node that wrote it


def test_the_api_passes_requests_on_only_through_the_router() -> None:
    """No second proxy: a request goes to another node only through ``LeaderRouter`` (its one call,
    ``_pass_on``), never through the node's peer session from a handler."""
    users = sorted(str(p.relative_to(API)) for p in API.rglob("*.py") if "peer_session" in p.read_text())
    assert users == [], users
