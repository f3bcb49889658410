"""The node's refusals an SQS client should retry are answered with codes botocore (the version
this project pins) retries: over the request cap ``RequestThrottled`` with 403 (botocore's legacy
mode has an SQS rule for exactly that pair, its standard mode lists the code as throttling), a
trickled body ``RequestTimeout`` (a transient code of the standard mode). raftmq's own 429
``too_many_requests`` reached SQS clients before, which botocore's query protocol could not even
parse (tests/integration/test_sqs_refusals.py runs the real clients)."""

from __future__ import annotations

import json
from pathlib import Path

import botocore
from botocore.retries.standard import ThrottledRetryableChecker, TransientRetryableChecker

from raftmq.cluster.api.sqs.errors import from_raftmq_error
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import ApiError


def _legacy_sqs_rules() -> list[dict[str, object]]:
    config = json.loads((Path(botocore.__file__).parent / "data" / "_retry.json").read_text())
    policies = config["retry"]["sqs"]["__default__"]["policies"]
    return [p["applies_when"]["response"] for p in policies.values()]


def test_over_the_cap_is_a_throttling_code_botocore_retries_in_both_modes() -> None:
    refused = from_raftmq_error(ApiError(errors.TOO_MANY_REQUESTS, "busy")).aws
    assert refused.code in ThrottledRetryableChecker._THROTTLED_ERROR_CODES
    assert {"service_error_code": refused.code, "http_status_code": refused.status} in _legacy_sqs_rules()


def test_a_late_body_is_a_transient_code_botocore_retries() -> None:
    late = from_raftmq_error(ApiError(errors.REQUEST_TIMEOUT, "late")).aws
    assert late.code in TransientRetryableChecker._TRANSIENT_ERROR_CODES
    assert late.status < 500  # the client's side: its body did not come
