"""Fuzz a running cluster from its own OpenAPI spec (schemathesis over hypothesis).

For every public operation, requests that fit the spec (positive) and requests that do not
(negative) go round-robin to the three nodes. No answer may be a 5xx; every 4xx must be a
catalogued error with the stable body; answers must match the spec's statuses, content types and
response schemas; and negative requests must be refused. Deterministic (``derandomize``) and
bounded: a fixed number of examples per operation and mode.
"""

from __future__ import annotations

import itertools
import re
import zlib
from functools import partial
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlsplit

import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from raftmq.cluster.api.app import create_app
from raftmq.cluster.api.openapi.spec import openapi_spec
from raftmq.cluster.base import errors
from raftmq.cluster.config.cluster_file import Limits, RaftTimingConfig
from raftmq.cluster.config.keys import derive_keys
from raftmq.cluster.config.tokens import SecurityConfig

from .conftest import assert_error_shape
from .harness import Cluster

pytestmark = pytest.mark.timeout(240)

TOPIC = "fuzz-target-topic"  # an existing topic, so produce/fetch/offsets get past the lookup
EXAMPLES = 50  # per operation and mode
MAX_WAIT_MS = 50  # long polls are clamped so that the run stays short
SPEC_PATHS = openapi_spec()["paths"]
OPERATIONS = [(method.upper(), path) for path, item in SPEC_PATHS.items() for method in item]
# The SQS API's routes: AWS's wire and errors, documented in docs/sqs.md, not in this spec.
SQS_ROUTES = {("POST", "/"), ("POST", "/{account}/{queue}")}
# Negative requests need something to get wrong: a parameter or a body.
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE
    or set(SPEC_PATHS[path][method.lower()]) & {"parameters", "requestBody"}
]


@pytest.fixture(scope="module")
def target(cluster: Cluster) -> Cluster:
    cluster.create_topic(TOPIC, queues=3)
    for q in range(3):
        assert cluster.produce(TOPIC, [{"value": f"m{i}", "queue": q} for i in range(4)]).status_code == 200
    return cluster


@pytest.fixture(scope="module")
def schema(target: Cluster) -> Any:
    """The spec as the cluster serves it."""
    spec = target.get("/openapi.json").json()
    return schemathesis.openapi.from_dict(spec)


def test_served_spec_is_the_spec_and_covers_every_public_route(cluster: Cluster) -> None:
    for nid in cluster.nodes:
        assert cluster.get("/openapi.json", nid).json() == openapi_spec(Limits())
    node = SimpleNamespace(
        config=SimpleNamespace(
            limits=Limits(), raft=RaftTimingConfig(), secret="s" * 16, security=SecurityConfig()
        ),
        keys=derive_keys("s" * 16),
    )
    app = create_app(node)  # type: ignore[arg-type]
    routes = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD" and not r.resource.canonical.startswith("/internal/")
    }
    assert routes >= SQS_ROUTES and routes - SQS_ROUTES == set(OPERATIONS)
    spec = openapi_spec()
    schemathesis.openapi.from_dict(spec).validate()  # against the OpenAPI 3.1 meta-schema
    codes = spec["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert codes == list(errors.BY_CODE)


def _integral(value: Any) -> Any:
    """Integral floats as ints: JSON Schema calls 1.0 an integer, raftmq wants 1 (see the spec)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _prepare(mode: GenerationMode, method: str) -> Any:
    """Adjust a generated case: long polls are short; two thirds of the positive cases are aimed at
    the existing topic and its queues, so that they get past the topic lookup."""

    def prepare(case: Any) -> Any:
        # A function of the drawn data (not a counter), so that hypothesis can replay a case.
        aim = zlib.crc32(repr((case.path_parameters, case.query)).encode()) % 3 != 0
        query = case.query or {}
        wait = query.get("wait_ms")
        if isinstance(wait, int) and not isinstance(wait, bool) and 0 <= wait <= 15_000:
            query["wait_ms"] = min(wait, MAX_WAIT_MS)
        body_wait = case.body.get("wait_ms") if isinstance(case.body, dict) else None
        if isinstance(body_wait, int) and not isinstance(body_wait, bool) and 0 <= body_wait <= 15_000:
            case.body["wait_ms"] = min(body_wait, MAX_WAIT_MS)  # receive long-polls in its body
        if mode is not GenerationMode.POSITIVE:
            return case
        body = case.body = _integral(case.body)
        if not aim or method == "DELETE":
            return case
        path_params = case.path_parameters or {}
        if "topic" in path_params:
            path_params["topic"] = TOPIC
        if "queue" in path_params:
            path_params["queue"] %= 3
        if "topic" in query:
            query["topic"] = TOPIC
        if isinstance(query.get("offset"), int):
            query["offset"] %= 8
        if isinstance(body, dict) and "topic" in body:
            body["topic"] = TOPIC
            body["offsets"] = {str(int(q) % 3): o % 5 for q, o in body["offsets"].items()}
        if isinstance(body, dict) and "messages" in body:
            for m in body["messages"]:
                if isinstance(m.get("queue"), int):
                    m["queue"] %= 3
        return case

    return prepare


def _check_error_body(response: requests.Response) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:1000]}"
    if response.status_code >= 400 and _is_sqs(response.request):  # AWS's error shapes
        assert "x-amzn-query-error" in response.headers or b"<ErrorResponse" in response.content, (
            response.text
        )
    elif response.status_code >= 400:
        assert_error_shape(response.json(), response.status_code)


def _is_sqs(request: requests.PreparedRequest) -> bool:
    path = urlsplit(request.url or "").path
    return request.method == "POST" and (path == "/" or re.fullmatch(r"/[0-9]{12}/[^/]+", path) is not None)


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_fuzzed_requests_never_get_a_server_error(
    target: Cluster, schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    operation = schema[path][method]
    strategies = [operation.as_strategy(generation_mode=mode)]
    if mode is GenerationMode.NEGATIVE and "{topic}" in path and method != "DELETE":
        strategies.append(operation.as_strategy(generation_mode=mode, path_parameters={"topic": TOPIC}))
    cases = st.one_of(strategies).map(_prepare(mode, method))
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    if mode is GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)
    nodes = itertools.cycle([target.url(nid) for nid in target.nodes])
    session = requests.Session()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def fuzz(case: Any) -> None:
        response = case.call(base_url=next(nodes), session=session, timeout=30)
        _check_error_body(response)
        if response.status_code == 413:
            # Too many messages or bytes: refused as too large, which schemathesis does not count
            # among the answers that reject a schema violation (its list stops at 4xx it knows).
            assert response.json()["error"]["code"] == "request_too_large", response.text[:500]
            case.validate_response(response, checks=[c for c in checks if c is not negative_data_rejection])
        else:
            case.validate_response(response, checks=checks)

    try:
        fuzz()
    finally:
        session.close()
    for nid in target.nodes:
        assert target.alive(nid) and target.get("/healthz", nid).status_code == 200


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SEGMENT = st.one_of(
    st.just(TOPIC),
    st.sampled_from(["0", "1", "-1", "99999999999999999999", "..", "%2e%2e", "a%2Fb", "%ff", "%00"]),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12).map(partial(quote, safe="")),
    st.binary(min_size=1, max_size=8).map(partial(quote, safe="")),
)


@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    template=st.sampled_from([path for _, path in OPERATIONS]),
    segments=st.lists(SEGMENT, min_size=2, max_size=2),
    query=st.dictionaries(st.sampled_from(["offset", "max", "wait_ms", "topic", "read_from", "x"]), SEGMENT),
    body=st.one_of(st.none(), st.binary(max_size=64), JSON.map(orjson.dumps)),
)
@settings(
    max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
def _arbitrary_request(
    c: Cluster, method: str, template: str, segments: list[str], query: dict[str, str], body: bytes | None
) -> None:
    path = re.sub(r"\{(topic|group|queue)\}", lambda m: segments[m.group(1) == "queue"], template)
    if "wait_ms" in query:
        query["wait_ms"] = "0"
    if method == "DELETE" and TOPIC in segments:
        method = "GET"  # keep the target topic
    url = c.url(list(c.nodes)[zlib.crc32(path.encode()) % 3]) + path
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    r = c.session.request(method, url, data=body, timeout=30)
    _check_error_body(r)


def test_arbitrary_paths_queries_and_bodies_never_get_a_server_error(target: Cluster) -> None:
    """Beyond the spec: any bytes as a body, any segment in a path, any query value."""
    _arbitrary_request(target)
    for nid in target.nodes:
        assert target.alive(nid) and target.get("/healthz", nid).status_code == 200
