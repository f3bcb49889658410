"""The SQS part of the OpenAPI spec: ``GET /v1/sqs/credentials`` (the SQS API itself, ``POST /``,
speaks AWS's protocols and is described in docs/sqs.md, not here)."""

from __future__ import annotations

from typing import Any

from raftmq.cluster.api.openapi.base import Schema, _json, _obj, _op, _ref, _str

__all__ = ["sqs_paths", "sqs_schemas"]


def sqs_schemas() -> dict[str, Schema]:
    return {
        "SqsCredentials": _obj(
            {
                "region": _str(description="The region SigV4 signatures must be scoped to ([sqs] region)."),
                "signature_checked": {
                    "type": "boolean",
                    "description": "False: no API tokens, so the SQS API takes any credentials.",
                },
                "access_key_id": _str(description="The calling token's name."),
                "secret_access_key": _str(
                    description="The calling token's AWS secret access key, derived from the cluster secret."
                ),
            },
            required=("region", "signature_checked"),
        )
    }


def sqs_paths() -> dict[str, Any]:
    return {
        "/v1/sqs/credentials": {
            "get": _op(
                "sqsCredentials",
                "The calling token's credentials for the SQS API's SigV4 signatures (docs/sqs.md); "
                "answered with Cache-Control: no-store",
                {"200": _json(_ref("SqsCredentials"), "the credentials")},
            )
        }
    }
