"""The security part of the OpenAPI spec: the bearer-token scheme and, on every operation that
needs a token (per :data:`raftmq.cluster.api.auth.ROUTES`), its 401/403 answers.

Authentication is off until the cluster file lists a token (docs/security.md), so each secured
operation accepts the bearer scheme *or* nothing (``{}``); the 401/403 answers apply once tokens
are configured. And what any operation may answer whoever calls it, from the bounds on what slow
clients hold (cluster/api/slow_clients.py): 429 over the node's cap of requests, 408 for a late body.
"""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.auth import OPEN, route_rule
from raftmq.cluster.api.openapi.base import _errors
from raftmq.cluster.api.slow_clients import HEALTH_PATHS

__all__ = ["add_node_bounds", "add_security"]

SCHEME = "bearerToken"
_METHODS = ("get", "put", "post", "delete", "patch")


def add_security(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the bearer scheme and the 401/403 answers of secured operations (in place)."""
    spec["components"]["securitySchemes"] = {
        SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token of the cluster file's [security] section; required on "
            "these operations once any token is configured.",
        }
    }
    refused = _errors(401, 403)
    for path, item in spec["paths"].items():
        for method in _METHODS:
            op = item.get(method)
            if op is None or route_rule(method.upper(), path, path) is OPEN:
                continue
            op["security"] = [{SCHEME: []}, {}]
            for status, answer in refused.items():
                op["responses"].setdefault(status, answer)
    return spec


def add_node_bounds(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the answers of the node's bounds on every operation (in place): 429
    ``too_many_requests`` past ``limits.http_max_requests`` clients' requests at once (not on a
    ``GET`` of ``/healthz`` or ``/readyz``, never counted), and on one taking a body 408
    ``request_timeout`` when it is not all sent in time (``slow_clients.body_deadline_s``)."""
    busy, late = _errors(429)["429"], _errors(408)["408"]
    for path, item in spec["paths"].items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            if method != "get" or path not in HEALTH_PATHS:
                op["responses"].setdefault("429", busy)
            if "requestBody" in op:
                op["responses"].setdefault("408", late)
    return spec
