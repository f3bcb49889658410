"""AWS Signature Version 4 as the SQS API checks it on a cluster with API tokens (docs/sqs.md,
docs/security.md): both forms, the ``Authorization`` header and the presigned query string
(``X-Amz-Algorithm``, ``X-Amz-Credential``, ... ``X-Amz-Signature``).

The canonical request follows AWS's specification for every service but S3 (what botocore's
``SigV4Auth`` signs; ``tests/unit/test_sqs_sigv4.py`` checks this module against botocore's signer):

    METHOD \\n canonical URI \\n canonical query \\n canonical headers \\n\\n signed headers \\n payload hash

- the URI is the path as sent, dot segments and empty segments removed, each character outside
  ``A-Z a-z 0-9 - _ . ~ /`` percent-encoded again (so ``%2F`` is signed as ``%252F``, as AWS does
  for every service but S3);
- the query's pairs decoded as the actions read them (``+`` a space), encoded again
  (``A-Z a-z 0-9 - _ . ~`` kept), sorted; the presigned
  form leaves ``X-Amz-Signature`` out;
- headers lower-cased, values trimmed with inner runs of spaces made one, repeated ones joined by
  ``,``; the payload hash is the SHA-256 of the body as received (a signature over
  ``UNSIGNED-PAYLOAD`` does not match: a body nobody signed is never accepted).

What must be signed, beyond AWS's minimum (``host``): the date header and every ``x-amz-*`` header
and ``content-type`` the request carries, so that no header that picks the action or the wire
(``X-Amz-Target``, ``Content-Type``) can be changed under a valid signature.

The module is pure: the caller passes the clock's reading and the secret of each access key id; no
secret or signature ever appears in an exception's message.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from raftmq.cluster.api.sqs.errors import SqsError

__all__ = [
    "ALGORITHM",
    "MAX_SKEW_S",
    "SERVICE",
    "Claimed",
    "canonical_request",
    "check_claim",
    "check_signature",
    "signing_key",
    "verify",
]

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
MAX_SKEW_S = 300  # a request dated more than 5 minutes from the node's clock is refused
MAX_EXPIRES_S = 604_800  # a presigned request's X-Amz-Expires: at most 7 days, as AWS
_TIMESTAMP = "%Y%m%dT%H%M%SZ"
_CREDENTIAL = re.compile(
    r"^([A-Za-z0-9_.-]{1,128})/([0-9]{8})/([a-z0-9-]{1,32})/([a-z0-9-]{1,32})/aws4_request\Z"
)
_SIGNATURE = re.compile(r"^[0-9a-f]{64}\Z")
_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]{1,128}\Z")
_UNRESERVED = "-_.~"
_AUTHORIZATION_FORM = "the Authorization header must be Credential=..., SignedHeaders=..., Signature=..."
_QUERY_KEYS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Signature")

P = TypeVar("P")


@dataclass(frozen=True)
class _Claim:
    """What a request says about its signature, parsed (not yet checked)."""

    access_key_id: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    timestamp: str  # X-Amz-Date
    expires_s: int | None  # the presigned form's X-Amz-Expires


@dataclass(frozen=True)
class Verified(Generic[P]):
    """A request whose signature matched: the principal of its access key id and its scope's region."""

    principal: P
    access_key_id: str
    region: str


def _incomplete(detail: str) -> SqsError:
    return SqsError("IncompleteSignature", f"The request signature is incomplete: {detail}.")


def _query_pairs(raw_query: str) -> list[tuple[str, str]]:
    """The query's pairs decoded as the actions read them (aiohttp's query: ``+`` is a space). Read
    with ``+`` as a ``+``, a value's ``%2B`` and ``+`` were the same signed text but different
    parameters: a presigned URL's holder could turn its ``+`` into spaces under its signature."""
    pairs = []
    for part in raw_query.split("&"):
        if part:
            key, _, value = part.partition("=")
            pairs.append((urllib.parse.unquote_plus(key), urllib.parse.unquote_plus(value)))
    return pairs


def _claim(headers: Mapping[str, str], query: Sequence[tuple[str, str]]) -> _Claim:
    params = dict(query)
    authorization = headers.get("Authorization")
    if authorization is not None:
        if "X-Amz-Signature" in params:
            raise _incomplete("sign in the Authorization header or in the query string, not both")
        scheme, _, rest = authorization.strip().partition(" ")
        if scheme != ALGORITHM:
            raise _incomplete(f"the Authorization header must use {ALGORITHM}")
        fields: dict[str, str] = {}
        for item in rest.split(","):
            key, eq, value = item.strip().partition("=")
            if not eq or key in fields:
                raise _incomplete(_AUTHORIZATION_FORM)
            fields[key] = value
        if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
            raise _incomplete(_AUTHORIZATION_FORM)
        credential, signed, signature = fields["Credential"], fields["SignedHeaders"], fields["Signature"]
        timestamp = headers.get("X-Amz-Date")
        if timestamp is None:
            raise _incomplete("the header X-Amz-Date is missing")
        expires_s = None
    else:
        missing = [k for k in _QUERY_KEYS if k not in params]
        if missing:
            raise _incomplete(f"the query string lacks {missing[0]}")
        if params["X-Amz-Algorithm"] != ALGORITHM:
            raise _incomplete(f"X-Amz-Algorithm must be {ALGORITHM}")
        credential, signed = params["X-Amz-Credential"], params["X-Amz-SignedHeaders"]
        signature, timestamp = params["X-Amz-Signature"], params["X-Amz-Date"]
        raw_expires = params.get("X-Amz-Expires", "")
        # isdigit alone takes "²", which int() refuses: a 500 and a traceback for anyone unsigned.
        digits = raw_expires.isascii() and raw_expires.isdigit()
        if not digits or not 1 <= int(raw_expires) <= MAX_EXPIRES_S:
            raise _incomplete(f"X-Amz-Expires must be from 1 to {MAX_EXPIRES_S} seconds")
        expires_s = int(raw_expires)
    match = _CREDENTIAL.match(credential)
    if match is None:
        raise _incomplete("the Credential must be <access key id>/<date>/<region>/<service>/aws4_request")
    names = tuple(signed.split(";"))
    if not all(_HEADER_NAME.match(n) for n in names) or list(names) != sorted(set(names)):
        raise _incomplete("SignedHeaders must be lower-case header names, sorted, separated by ;")
    if not _SIGNATURE.match(signature):
        raise _incomplete("the Signature must be 64 hex digits")
    return _Claim(
        access_key_id=match.group(1),
        date=match.group(2),
        region=match.group(3),
        service=match.group(4),
        signed_headers=names,
        signature=signature,
        timestamp=timestamp,
        expires_s=expires_s,
    )


def _canonical_uri(raw_path: str) -> str:
    segments: list[str] = []
    for s in raw_path.split("/"):
        if s == "..":
            if segments:
                segments.pop()
        elif s and s != ".":
            segments.append(s)
    path = "/" + "/".join(segments)
    if raw_path.endswith("/") and segments:
        path += "/"
    return urllib.parse.quote(path, safe="/~")


def canonical_request(
    method: str,
    raw_path: str,
    query: Sequence[tuple[str, str]],
    headers: Callable[[str], list[str]],
    signed_headers: Sequence[str],
    payload_hash: str,
) -> str:
    """The canonical request of a request: ``query`` its decoded pairs (the signature's own left
    out), ``headers(name)`` every value of a header (lower-case name)."""
    pairs = sorted(
        (urllib.parse.quote(k, safe=_UNRESERVED), urllib.parse.quote(v, safe=_UNRESERVED)) for k, v in query
    )
    lines = [f"{n}:{','.join(' '.join(v.split()) for v in headers(n))}" for n in signed_headers]
    return "\n".join(
        [
            method.upper(),
            _canonical_uri(raw_path),
            "&".join(f"{k}={v}" for k, v in pairs),
            "\n".join(lines) + "\n",
            ";".join(signed_headers),
            payload_hash,
        ]
    )


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


@dataclass(frozen=True)
class Claimed(Generic[P]):
    """A request whose signature's claims passed every check the headers allow (:func:`check_claim`):
    the body's hash and the signature itself are left (:func:`check_signature`)."""

    claim: _Claim
    query: list[tuple[str, str]]
    secret: str
    principal: P


def check_claim(
    raw_query: str,
    headers: Mapping[str, str],
    now: datetime.datetime,
    region: str,
    credentials: Callable[[str], tuple[str, P] | None],
) -> Claimed[P]:
    """Everything of a SigV4 check that needs no body: the signature's form, a known access key id,
    the scope and the clock, the headers that must be signed. A caller reads the body only after it
    (an unknown key or a stale date is refused before anyone's body is read), then calls
    :func:`check_signature`. Arguments and errors as :func:`verify`'s."""
    query = _query_pairs(raw_query)
    if headers.get("Authorization") is None and not any(k == "X-Amz-Signature" for k, _ in query):
        raise SqsError(
            "MissingAuthenticationToken",
            "The request must contain an AWS Signature Version 4 (this cluster has API tokens; docs/sqs.md).",
        )
    claim = _claim(headers, query)
    found = credentials(claim.access_key_id)
    session_token = "X-Amz-Security-Token" in headers or any(k == "X-Amz-Security-Token" for k, _ in query)
    if found is None or session_token:  # raftmq issues no session (STS) credentials
        raise SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
    secret, principal = found
    if claim.service != SERVICE:
        raise SqsError("SignatureDoesNotMatch", f"Credential should be scoped to the service '{SERVICE}'.")
    if claim.region != region:
        raise SqsError("SignatureDoesNotMatch", f"Credential should be scoped to a valid region: '{region}'.")
    try:
        signed_at = datetime.datetime.strptime(claim.timestamp, _TIMESTAMP).replace(tzinfo=datetime.UTC)
    except ValueError:
        raise _incomplete("X-Amz-Date must be YYYYMMDDTHHMMSSZ") from None
    if claim.date != claim.timestamp[:8]:
        raise SqsError("SignatureDoesNotMatch", "The credential scope's date must be the date of X-Amz-Date.")
    skew_s = (now - signed_at).total_seconds()
    if claim.expires_s is not None and skew_s > claim.expires_s:
        raise SqsError("RequestExpired", "Request has expired (its X-Amz-Expires has passed).")
    if abs(skew_s) > MAX_SKEW_S and (claim.expires_s is None or skew_s < 0):
        raise SqsError(
            "RequestExpired",
            f"Request has expired: it is dated {claim.timestamp}, more than {MAX_SKEW_S // 60} minutes "
            "from the node's clock.",
        )
    required = {"host", *(k.lower() for k in headers if k.lower().startswith("x-amz-"))}
    if "content-type" in (k.lower() for k in headers):
        required.add("content-type")
    required.discard("x-amz-security-token")
    unsigned = sorted(required - set(claim.signed_headers))
    if unsigned:
        raise SqsError("SignatureDoesNotMatch", f"The header {unsigned[0]} must be signed (SignedHeaders).")
    return Claimed(claim, query, secret, principal)


def check_signature(
    claimed: Claimed[P], method: str, raw_path: str, all_values: Callable[[str], list[str]], body: bytes
) -> Verified[P]:
    """The signature of a request :func:`check_claim` passed, over its body as received."""
    claim = claimed.claim
    signed_query = [(k, v) for k, v in claimed.query if k != "X-Amz-Signature"]
    canonical = canonical_request(
        method, raw_path, signed_query, all_values, claim.signed_headers, hashlib.sha256(body).hexdigest()
    )
    scope = f"{claim.date}/{claim.region}/{claim.service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, claim.timestamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = signing_key(claimed.secret, claim.date, claim.region, claim.service)
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, claim.signature):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return Verified(claimed.principal, claim.access_key_id, claim.region)


def verify(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    all_values: Callable[[str], list[str]],
    body: bytes,
    now: datetime.datetime,
    region: str,
    credentials: Callable[[str], tuple[str, P] | None],
) -> Verified[P]:
    """Check a request's SigV4 signature; its principal when it matches (:func:`check_claim`, then
    :func:`check_signature`).

    Args:
        headers: the request's headers (case-insensitive lookups); ``all_values(name)`` every value
            of the lower-case header ``name``.
        now: the node's clock (aware, UTC).
        region: the only region a credential scope may name.
        credentials: the secret access key and principal of an access key id (None: unknown).

    Raises:
        SqsError: MissingAuthenticationToken (no signature at all), IncompleteSignature (a malformed
            one), InvalidClientTokenId (an unknown access key id, or a session token, which raftmq
            never issues), SignatureDoesNotMatch (a wrong signature, region or service),
            RequestExpired (dated more than MAX_SKEW_S from ``now``, or a presigned request past
            its X-Amz-Expires).
    """
    claimed = check_claim(raw_query, headers, now, region, credentials)
    return check_signature(claimed, method, raw_path, all_values, body)
