"""The security part of the OpenAPI spec: the bearer-token scheme and, on every operation that
needs a token (per :data:`raftmq.cluster.api.auth.ROUTES`), its 401/403 answers.

Authentication is off until the cluster file lists a token (docs/security.md), so each secured
operation accepts the bearer scheme *or* nothing (``{}``); the 401/403 answers apply once tokens
are configured.
"""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.auth import OPEN, route_rule
from raftmq.cluster.api.openapi.base import _errors

__all__ = ["add_security"]

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
