"""A presigned SQS URL on a real 3-node cluster with API tokens (docs/sqs.md, "Authentication"):
its parameters are the ones signed. A presigned URL is handed out for others to use; ``+`` and
``%2B`` in its query were the same signed text but different parameters (the action reads ``+``
as a space), so its holder could turn a signed ``%2B`` into a space: ``MessageBody=1%2B1`` sent
``1 1``. Now that is ``SignatureDoesNotMatch`` and sends nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from .harness import Cluster, running, tokens_toml
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(180)

TOKEN = "presign-token-0123456789abcdef01"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    security = tokens_toml([("sender", TOKEN, '["*"]', '["*"]', '["*"]')])
    with running(Cluster(tmp_path_factory.mktemp("sqs-presigned"), extra_toml=security), TOKEN) as cluster:
        yield cluster


def test_a_presigned_urls_plus_signs_stay_plus_signs(c: Cluster) -> None:
    answer = c.get("/v1/sqs/credentials").json()
    credentials = (answer["access_key_id"], answer["secret_access_key"])
    sqs = sqs_client(c.url(), credentials, "us-east-1")
    url = sqs.create_queue(QueueName="presigned")["QueueUrl"]
    request = AWSRequest(method="POST", url=f"{url}?Action=SendMessage&MessageBody=1%2B1&Version=2012-11-05")
    SigV4QueryAuth(Credentials(*credentials), "sqs", "us-east-1", expires=60).add_auth(request)
    presigned = request.prepare().url
    tampered = presigned.replace("MessageBody=1%2B1", "MessageBody=1+1")
    assert tampered != presigned
    r = requests.post(tampered, timeout=10)
    assert r.status_code == 403 and "<Code>SignatureDoesNotMatch</Code>" in r.text, r.text
    assert requests.post(presigned, timeout=10).status_code == 200
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    assert [m["Body"] for m in got] == ["1+1"]
