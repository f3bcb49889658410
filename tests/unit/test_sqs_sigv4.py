"""SigV4 as the SQS API checks it (cluster/api/sqs/sigv4.py): requests signed by botocore's own
signer (header and presigned query forms) verify, and every change to what was signed, a wrong
key, scope or clock is refused with AWS's code and without a secret in the message; plus AWS's
published test vector and the derivation of a token's secret access key."""

from __future__ import annotations

import datetime
import hashlib
import hmac
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict

from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.api.sqs.sigv4 import canonical_request, signing_key, verify
from raftmq.cluster.config.keys import derive_keys, sqs_secret_key
from raftmq.cluster.config.tokens import token_digest

KEY_ID, SECRET = "orders-service", "k9Qx2_Lr-7cVb0tYwZ3eNf8gHs1jKpUoIaDmEq4R"
REGION = "eu-west-1"
JSON_HEADERS = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage"}
BODY = b'{"QueueUrl": "http://127.0.0.1:8081/000000000000/orders", "MessageBody": "hi"}'


def _signed(
    url: str = "http://127.0.0.1:8081/",
    body: bytes = BODY,
    headers: dict[str, str] | None = None,
    secret: str = SECRET,
    key_id: str = KEY_ID,
    region: str = REGION,
    service: str = "sqs",
    query_form: bool = False,
) -> AWSRequest:
    request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers or JSON_HEADERS))
    credentials = Credentials(key_id, secret)
    signer = (
        SigV4QueryAuth(credentials, service, region, expires=60)
        if query_form
        else SigV4Auth(credentials, service, region)
    )
    signer.add_auth(request)
    return request


def _verify(request: AWSRequest, now: datetime.datetime | None = None, **changes: Any) -> str:
    parts = urlsplit(changes.get("url", request.url))
    headers: CIMultiDict[str] = CIMultiDict(request.headers.items())
    if "host" not in headers:
        headers["Host"] = parts.netloc
    for name, value in changes.get("headers", {}).items():
        if value is None:
            del headers[name]
        else:
            headers[name] = value
    body = changes.get("body", request.body or b"")
    verified = verify(
        "POST",
        parts.path,
        parts.query,
        headers,
        lambda name: headers.getall(name, []),
        body if isinstance(body, bytes) else body.encode(),
        now or datetime.datetime.now(datetime.UTC),
        REGION,
        lambda key_id: (SECRET, f"grant {key_id}") if key_id == KEY_ID else None,
    )
    return str(verified.principal)


def _refused(request: AWSRequest, code: str, **changes: Any) -> SqsError:
    with pytest.raises(SqsError) as e:
        _verify(request, **changes)
    assert e.value.aws.code == code, e.value.message
    assert (
        SECRET not in e.value.message
        and signing_key(SECRET, "20260101", REGION, "sqs").hex() not in e.value.message
    )
    return e.value


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8081/",
        "http://127.0.0.1:8081/000000000000/orders",
        "http://localhost:8082/000000000000/odd%2Fname%20x/../orders",
        "http://127.0.0.1:8081/?Action=ListQueues&QueueNamePrefix=a%20b%2Bc&Version=2012-11-05",
    ],
)
def test_botocores_header_signature_verifies(url: str) -> None:
    assert _verify(_signed(url)) == f"grant {KEY_ID}"


def test_a_query_protocol_form_post_verifies() -> None:
    form = (
        b"Action=SendMessage&MessageBody=a+b%26c&QueueUrl=http%3A%2F%2Fh%2F000000000000%2Fq"
        b"&Version=2012-11-05"
    )
    request = _signed(body=form, headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    assert _verify(request) == f"grant {KEY_ID}"


def test_botocores_presigned_query_string_verifies_until_it_expires() -> None:
    request = _signed("http://127.0.0.1:8081/000000000000/orders", body=b"", headers={}, query_form=True)
    assert "X-Amz-Signature=" in request.url and "Authorization" not in request.headers
    assert _verify(request) == f"grant {KEY_ID}"
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=90)
    with pytest.raises(SqsError) as e:
        _verify(request, now=later)
    assert e.value.aws.code == "RequestExpired"


@pytest.mark.parametrize("expires", ["%C2%B2", "1%C2%B2", "%D9%A1%D9%A2", "-5", "0", "604801", ""])
def test_a_presigned_request_with_an_expiry_of_no_ascii_digits_is_incomplete(expires: str) -> None:
    """ "²" passed str.isdigit and made int() raise: an InternalError (500) and a logged traceback
    for a request anyone could send without a credential."""
    request = _signed("http://127.0.0.1:8081/000000000000/orders", body=b"", headers={}, query_form=True)
    url = request.url.replace("X-Amz-Expires=60", f"X-Amz-Expires={expires}")
    assert url != request.url
    _refused(request, "IncompleteSignature", url=url)


def test_a_plus_in_a_signed_query_is_a_space_as_the_action_reads_it() -> None:
    """The action reads ``+`` in a query as a space (aiohttp's query), the signature read it as a
    ``+``: ``%2B`` and ``+`` were the same signed text and different parameters, so anyone holding
    a presigned URL (handed out to be used by others) could turn its ``%2B`` into spaces."""
    url = "http://127.0.0.1:8081/000000000000/orders?Action=SendMessage&MessageBody=1%2B1"
    request = _signed(url, body=b"", headers={}, query_form=True)
    assert _verify(request) == f"grant {KEY_ID}"
    tampered = request.url.replace("MessageBody=1%2B1", "MessageBody=1+1")
    assert tampered != request.url
    _refused(request, "SignatureDoesNotMatch", url=tampered)
    spaced = _signed(url.replace("1%2B1", "1%201"), body=b"", headers={}, query_form=True)
    assert _verify(spaced, url=spaced.url.replace("1%201", "1+1")) == f"grant {KEY_ID}"  # a space


def test_a_credential_date_of_other_digits_is_incomplete() -> None:
    request = _signed()
    header = request.headers["Authorization"].replace(request.headers["X-Amz-Date"][:8], "١٢٣٤٥٦٧٨")
    _refused(request, "IncompleteSignature", headers={"Authorization": header})


def test_anything_changed_after_signing_does_not_match() -> None:
    request = _signed()
    _refused(request, "SignatureDoesNotMatch", body=BODY.replace(b"hi", b"ho"))
    _refused(request, "SignatureDoesNotMatch", headers={"X-Amz-Target": "AmazonSQS.DeleteQueue"})
    _refused(request, "SignatureDoesNotMatch", headers={"Host": "127.0.0.1:9999"})
    _refused(request, "SignatureDoesNotMatch", url="http://127.0.0.1:8081/000000000000/other")
    _refused(request, "SignatureDoesNotMatch", url="http://127.0.0.1:8081/?Action=DeleteQueue")
    _refused(_signed(secret=SECRET[:-1] + "x"), "SignatureDoesNotMatch")


def test_headers_that_pick_the_action_or_the_wire_must_be_signed() -> None:
    request = _signed(headers={"Content-Type": "application/x-amz-json-1.0"})
    e = _refused(request, "SignatureDoesNotMatch", headers={"X-Amz-Target": "AmazonSQS.DeleteQueue"})
    assert "x-amz-target" in e.message


def test_wrong_key_scope_and_session_tokens_are_refused() -> None:
    _refused(_signed(key_id="someone-else"), "InvalidClientTokenId")
    _refused(_signed(region="us-west-2"), "SignatureDoesNotMatch")
    _refused(_signed(service="sns"), "SignatureDoesNotMatch")
    request = _signed()
    _refused(request, "InvalidClientTokenId", headers={"X-Amz-Security-Token": "FwoGZXIvYXdzE"})


@pytest.mark.parametrize("minutes", [-6, 6, 60 * 24])
def test_a_request_dated_more_than_five_minutes_away_is_expired(minutes: int) -> None:
    request = _signed()
    now = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=minutes)
    with pytest.raises(SqsError) as e:
        _verify(request, now=now)
    assert e.value.aws.code == "RequestExpired" and e.value.aws.status == 400
    assert _verify(request, now=datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=4))


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        (None, "MissingAuthenticationToken"),
        ("Bearer abcdefghijklmnopqrstuvwxyz", "IncompleteSignature"),
        (
            "AWS4-HMAC-SHA256 Credential=orders-service/20260101/eu-west-1/sqs/aws4_request",
            "IncompleteSignature",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=x, SignedHeaders=host, Signature=" + "0" * 64,
            "IncompleteSignature",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=orders-service/20260101/eu-west-1/sqs/aws4_request, "
            "SignedHeaders=x-amz-date;host, Signature=" + "0" * 64,
            "IncompleteSignature",
        ),
    ],
)
def test_missing_or_malformed_signatures(authorization: str | None, code: str) -> None:
    _refused(_signed(), code, headers={"Authorization": authorization})


def test_aws_published_vector_get_vanilla() -> None:
    """AWS's SigV4 test suite, get-vanilla (service "service", us-east-1, 2015-08-30T12:36:00Z)."""
    headers = {"host": ["example.amazonaws.com"], "x-amz-date": ["20150830T123600Z"]}
    canonical = canonical_request(
        "GET", "/", [], lambda n: headers[n], ["host", "x-amz-date"], hashlib.sha256(b"").hexdigest()
    )
    scope = "20150830/us-east-1/service/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", "20150830T123600Z", scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20150830", "us-east-1", "service")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    assert signature == "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"


def test_a_tokens_secret_access_key_follows_its_token_and_the_cluster_secret() -> None:
    keys = derive_keys("a cluster secret of enough length")
    secret = sqs_secret_key(keys.sqs, "orders", token_digest("t" * 32))
    assert len(secret) == 40 and secret == sqs_secret_key(keys.sqs, "orders", token_digest("t" * 32))
    assert secret != sqs_secret_key(keys.sqs, "orders", token_digest("u" * 32))  # a rotated token
    assert secret != sqs_secret_key(keys.sqs, "orderz", token_digest("t" * 32))
    other = derive_keys("another cluster secret, as long")
    assert secret != sqs_secret_key(other.sqs, "orders", token_digest("t" * 32))
    assert keys.sqs not in repr(keys) and keys.sqs not in (keys.peer, keys.raft, keys.backup)
