"""The OpenAPI 3.1 description of the HTTP API v1 (``GET /openapi.json``)."""

from __future__ import annotations

from typing import Any

from . import errors

__all__ = ["openapi_spec"]


def openapi_spec() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "raftmq", "version": "1"},
        "paths": {},
        "components": {"schemas": {"ErrorCode": {"enum": sorted(errors.BY_CODE)}}},
    }
