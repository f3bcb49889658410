"""SigV4 on the SQS API of a cluster with API tokens, with real boto3 and botocore clients against a
real 3-node cluster (docs/sqs.md "Authentication", docs/security.md): a token's SQS credentials
come from GET /v1/sqs/credentials; the right key works on both wires; a wrong secret, an unknown
key, a wrong region, an old (replayed) request, a bearer token or the peer key are refused with
AWS's codes and change nothing; each action needs the token's permission on its queue, as the
REST API's routes do."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import botocore.auth
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from .harness import PEER_KEY, Cluster
from .sqs_clients import query_sqs_client, sqs_client

TOKENS = {
    "admin": "sqs-admin-token-0123456789abcdef",
    "producer": "sqs-producer-token-0123456789ab",
    "consumer": "sqs-consumer-token-0123456789ab",
    "auditor": "sqs-auditor-token-0123456789abc",  # admin on audit-* only: nothing on orders
}
SECURITY_TOML = f"""
[sqs]
region = "eu-west-1"

[security]
[[security.tokens]]
name = "admin"
token = "{TOKENS["admin"]}"
admin = ["*"]
produce = ["*"]
consume = ["*"]

[[security.tokens]]
name = "producer"
token = "{TOKENS["producer"]}"
produce = ["orders*"]

[[security.tokens]]
name = "consumer"
token = "{TOKENS["consumer"]}"
consume = ["orders*"]

[[security.tokens]]
name = "auditor"
token = "{TOKENS["auditor"]}"
admin = ["audit-*"]
"""
NO_RETRY = {"retries": {"max_attempts": 1}}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("sqs-auth"), nodes=3, extra_toml=SECURITY_TOML) as c:
        c.start()
        c.wait_ready()
        yield c


def _credentials(c: Cluster, name: str, node: str = "n1") -> tuple[str, str]:
    r = c.get("/v1/sqs/credentials", node, headers={"Authorization": f"Bearer {TOKENS[name]}"})
    assert r.status_code == 200 and r.headers["Cache-Control"] == "no-store", r.text
    body = r.json()
    assert body["access_key_id"] == name and body["region"] == "eu-west-1" and body["signature_checked"]
    return body["access_key_id"], body["secret_access_key"]


def _client(c: Cluster, name: str, node: str = "n1") -> Any:
    return sqs_client(c.url(node), _credentials(c, name), **NO_RETRY)


def _code(call: Callable[[], Any]) -> tuple[str, int]:
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def _topics(c: Cluster) -> list[str]:
    r = c.get("/v1/topics", headers={"Authorization": f"Bearer {TOKENS['admin']}"})
    return [t["name"] for t in r.json()["topics"]]


def test_each_tokens_credentials_are_its_own_and_the_same_on_every_node(secure: Cluster) -> None:
    creds = {name: _credentials(secure, name) for name in TOKENS}
    assert len({secret for _, secret in creds.values()}) == len(TOKENS)
    assert all(_credentials(secure, name, "n3") == creds[name] for name in TOKENS)
    assert secure.get("/v1/sqs/credentials").status_code == 401  # a token is needed to read them
    by_peer = secure.get("/v1/sqs/credentials", headers={"X-Raftmq-Peer-Key": PEER_KEY}).json()
    assert by_peer == {"region": "eu-west-1", "signature_checked": True}  # no token, no secret
    for name, (_, secret) in creds.items():
        assert secret not in (TOKENS[name], *TOKENS.values())
        for node in secure.nodes:
            assert secret not in secure.log(node)


def test_the_right_key_works_on_both_wires(secure: Cluster, tmp_path: Path) -> None:
    sqs = _client(secure, "admin", "n2")
    url = sqs.create_queue(QueueName="orders-signed")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="json wire")
    query = query_sqs_client(secure.url("n3"), tmp_path, _credentials(secure, "admin"), region="eu-west-1")
    query.send_message(QueueUrl=url, MessageBody="query wire")
    got: list[str] = []
    for _ in range(20):
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            got.append(m["Body"])
            query.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if len(got) == 2:
            break
    assert sorted(got) == ["json wire", "query wire"]
    assert query.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"] == {
        "QueueArn": "arn:aws:sqs:eu-west-1:000000000000:orders-signed"
    }


def test_bad_credentials_are_refused_and_change_nothing(secure: Cluster) -> None:
    key_id, secret = _credentials(secure, "admin")
    cases = [
        (sqs_client(secure.url("n1"), (key_id, secret[:-1] + "x"), **NO_RETRY), "SignatureDoesNotMatch"),
        (sqs_client(secure.url("n1"), ("nobody", secret), **NO_RETRY), "InvalidClientTokenId"),
        (sqs_client(secure.url("n1"), (key_id, TOKENS["admin"]), **NO_RETRY), "SignatureDoesNotMatch"),
        (
            sqs_client(secure.url("n1"), (key_id, secret), region="us-east-1", **NO_RETRY),
            "SignatureDoesNotMatch",
        ),
    ]
    for client, code in cases:
        assert _code(lambda client=client: client.create_queue(QueueName="orders-never")) == (code, 403)
        assert _code(lambda client=client: client.list_queues()) == (code, 403)
    assert "orders-never" not in _topics(secure)


def test_a_bearer_token_or_the_peer_key_does_not_open_sqs(secure: Cluster) -> None:
    json_headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"}
    body = b'{"QueueName": "orders-locked-out"}'
    for extra in ({"Authorization": f"Bearer {TOKENS['admin']}"}, {"X-Raftmq-Peer-Key": PEER_KEY}, {}):
        r = requests.post(secure.url("n2") + "/", data=body, headers={**json_headers, **extra}, timeout=10)
        assert r.status_code in (400, 403), r.text
        assert r.headers["x-amzn-query-error"].split(";")[0] in (
            "MissingAuthenticationToken",
            "IncompleteSignature",
        )
        assert TOKENS["admin"] not in r.text and PEER_KEY not in r.text
    r = requests.post(
        secure.url("n3") + "/000000000000/orders-locked-out",
        data={"Action": "CreateQueue", "QueueName": "orders-locked-out"},
        timeout=10,
    )
    assert r.status_code == 403 and "<Code>MissingAuthenticationToken</Code>" in r.text
    assert "orders-locked-out" not in _topics(secure)


def test_a_presigned_expiry_that_is_no_number_is_incomplete_not_an_internal_error(secure: Cluster) -> None:
    """X-Amz-Expires=² passed str.isdigit and made int() raise: a 500 and a traceback in the node's
    log for each such request, which needs no credential."""
    query = (
        "Action=ListQueues&X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=admin%2F20261130%2Feu-west-1%2Fsqs%2Faws4_request&X-Amz-Date=20261130T000000Z"
        f"&X-Amz-Expires=%C2%B2&X-Amz-SignedHeaders=host&X-Amz-Signature={'0' * 64}"
    )
    r = requests.post(secure.url("n1") + "/?" + query, timeout=10)
    assert r.status_code == 400 and "<Code>IncompleteSignature</Code>" in r.text, r.text
    assert "sqs_action_failed" not in secure.log("n1")


def test_a_body_cut_short_before_any_credential_is_checked_logs_nothing(secure: Cluster) -> None:
    """A client that leaves mid-body where nothing checked a credential yet (the SQS API reads the
    body before its signature; POST /internal/proof is open): the read raised ConnectionResetError,
    logged as sqs_action_failed with a traceback, or as peer_call_failed, a line per connection
    that anyone could open."""
    host, port = secure.nodes["n2"].http.split(":")
    logged = len(secure.log("n2"))
    requests_cut_short = [
        (b"/", b"Content-Type: application/x-amz-json-1.0\r\nX-Amz-Target: AmazonSQS.ListQueues\r\n"),
        (b"/", b"Content-Type: application/x-www-form-urlencoded\r\n"),
        (b"/internal/proof", b"Content-Type: application/json\r\n"),
    ]
    for path, headers in requests_cut_short:
        for framing in (b"Content-Length: 1000\r\n", b"Transfer-Encoding: chunked\r\n"):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + headers + framing + b"\r\n5\r\n{}")
                s.shutdown(socket.SHUT_WR)  # the client is gone before the body ends
                s.recv(4096)
    r = requests.post(secure.url("n2") + "/", data={"Action": "ListQueues"}, timeout=10)
    assert r.status_code == 403  # the node serves on (MissingAuthenticationToken)
    since = secure.log("n2")[logged:]
    assert "sqs_action_failed" not in since and "peer_call_failed" not in since, since
    assert "Traceback" not in since, since


def _claimed_signature(key: str, at: datetime.datetime) -> bytes:
    """The headers of a SigV4 claim by ``key`` dated ``at`` (its signature is zeros: only what a
    node checks before the body can pass)."""
    scope = f"{key}/{at:%Y%m%d}/eu-west-1/sqs/aws4_request"
    return (
        f"Authorization: AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders=content-type;host;x-amz-date;"
        f"x-amz-target, Signature={'0' * 64}\r\nX-Amz-Date: {at:%Y%m%dT%H%M%SZ}\r\n"
    ).encode()


def _head_of_answer_to_unsent_body(c: Cluster, signed: bytes, timeout_s: float) -> bytes:
    """The answer's head to a ListQueues claiming a 1 MB body of which one byte is sent (a socket
    timeout here: the node still waits for the body)."""
    host, port = c.nodes["n2"].http.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-amz-json-1.0\r\n"
            b"X-Amz-Target: AmazonSQS.ListQueues\r\n" + signed + b"Content-Length: 1000000\r\n\r\n{"
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
    return answer


def test_a_request_without_a_known_key_is_refused_before_its_body_is_read(secure: Cluster) -> None:
    """Unsigned, an unknown key or a stale date: the answer comes while the body is still unsent
    (the node read up to the request limit first, for anyone, before it looked at the headers)."""
    now = datetime.datetime.now(datetime.UTC)
    cases = [
        (b"", "MissingAuthenticationToken"),
        (_claimed_signature("nobody", now), "InvalidClientTokenId"),
        (_claimed_signature("admin", now - datetime.timedelta(hours=1)), "RequestExpired"),
    ]
    for signed, code in cases:
        answer = _head_of_answer_to_unsent_body(secure, signed, 10)
        assert answer.startswith(b"HTTP/1.1 4"), answer
        assert code.encode() in answer.split(b"\r\n\r\n")[0], answer  # x-amzn-query-error


def test_a_body_trickled_under_a_known_key_is_refused_at_the_request_timeout(secure: Cluster) -> None:
    """A known key and a fresh date get the body read, before the signature can be checked: a body
    that never arrives is answered after ``limits.request_timeout_ms`` (10 s here; the node waited
    for it for good before), not held with the bytes it buffered. ``RequestTimeout``, which botocore's
    standard mode retries (it was ``InvalidParameterValue``, which no SDK retries)."""
    signed = _claimed_signature("admin", datetime.datetime.now(datetime.UTC))
    answer = _head_of_answer_to_unsent_body(secure, signed, 40)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"x-amzn-query-error: RequestTimeout;Sender" in answer, answer
    assert b"did not arrive" in answer, answer


def test_an_old_request_replayed_is_expired(secure: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request signed and captured 6 minutes ago, sent again now: RequestExpired, nothing done. The
    same request replayed within the window is accepted, as AWS does."""
    sqs = _client(secure, "admin")
    url = sqs.create_queue(QueueName="orders-replay")["QueueUrl"]
    captured: list[Any] = []
    sqs.meta.events.register("before-send.sqs.SendMessage", lambda request, **_: captured.append(request))
    real_now = botocore.auth.get_current_datetime
    monkeypatch.setattr(
        botocore.auth, "get_current_datetime", lambda: real_now() - datetime.timedelta(minutes=6)
    )
    assert _code(lambda: sqs.send_message(QueueUrl=url, MessageBody="late")) == ("RequestExpired", 400)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", real_now)
    sqs.send_message(QueueUrl=url, MessageBody="on time")
    old, fresh = captured[0], captured[1]
    for request, status in ((old, 400), (fresh, 200)):
        r = requests.post(request.url, data=request.body, headers=dict(request.headers.items()), timeout=10)
        assert r.status_code == status, r.text
    bodies = [
        m["Body"]
        for _ in range(5)
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
    ]
    assert sorted(bodies) == ["on time", "on time"]


def test_each_action_needs_the_tokens_permission_on_its_queue(secure: Cluster) -> None:
    admin = _client(secure, "admin")
    url = admin.create_queue(QueueName="orders-rights")["QueueUrl"]
    admin.create_queue(QueueName="audit-log")
    producer, consumer, auditor = (_client(secure, n, "n2") for n in ("producer", "consumer", "auditor"))
    denied = ("AccessDenied", 403)

    # produce: send, and read the queue's URL and attributes; nothing a consumer or admin does.
    producer.send_message(QueueUrl=url, MessageBody="one")
    producer.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "two"}])
    assert producer.get_queue_url(QueueName="orders-rights")["QueueUrl"].endswith("/orders-rights")
    producer.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    for call in (
        lambda: producer.receive_message(QueueUrl=url),
        lambda: producer.delete_message(QueueUrl=url, ReceiptHandle="1.0.0.1"),
        lambda: producer.change_message_visibility(
            QueueUrl=url, ReceiptHandle="1.0.0.1", VisibilityTimeout=5
        ),
        lambda: producer.purge_queue(QueueUrl=url),
        lambda: producer.create_queue(QueueName="orders-new"),
        lambda: producer.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"}),
        lambda: producer.delete_queue(QueueUrl=url),
    ):
        assert _code(call) == denied

    # consume: receive, delete, change visibility, purge; no send, no admin.
    got = consumer.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
    consumer.change_message_visibility(
        QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"], VisibilityTimeout=60
    )
    consumer.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
    )
    consumer.purge_queue(QueueUrl=url)
    for call in (
        lambda: consumer.send_message(QueueUrl=url, MessageBody="x"),
        lambda: consumer.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x"}]),
        lambda: consumer.create_queue(QueueName="orders-new"),
        lambda: consumer.delete_queue(QueueUrl=url),
    ):
        assert _code(call) == denied

    # No permission on the queue at all: not even its URL or attributes; the list leaves it out.
    for call in (
        lambda: auditor.get_queue_url(QueueName="orders-rights"),
        lambda: auditor.get_queue_attributes(QueueUrl=url),
        lambda: auditor.send_message(QueueUrl=url, MessageBody="x"),
        lambda: auditor.receive_message(QueueUrl=url),
        lambda: auditor.delete_queue(QueueUrl=url),
    ):
        assert _code(call) == denied
    assert [u.rsplit("/", 1)[-1] for u in auditor.list_queues().get("QueueUrls", [])] == ["audit-log"]
    assert "orders-rights" in [u.rsplit("/", 1)[-1] for u in producer.list_queues()["QueueUrls"]]
    auditor.set_queue_attributes(
        QueueUrl=url.replace("orders-rights", "audit-log"), Attributes={"DelaySeconds": "0"}
    )
    assert "orders-new" not in _topics(secure) and "orders-rights" in _topics(secure)
    assert admin.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])["Attributes"] == {
        "DelaySeconds": "0"
    }


def test_the_cli_prints_the_tokens_credentials_for_boto3(secure: Cluster) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", "sqs-credentials", "--url", secure.url("n2")],
        env={**os.environ, "RAFTMQ_TOKEN": TOKENS["producer"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    env = dict(line.split("=", 1) for line in out.splitlines())
    key_id, secret = _credentials(secure, "producer")
    assert env == {
        "AWS_ACCESS_KEY_ID": key_id,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "eu-west-1",
    }


def test_a_redrive_policy_needs_produce_on_its_dead_letter_queue(secure: Cluster) -> None:
    admin, auditor = _client(secure, "admin"), _client(secure, "auditor", "n3")
    admin.create_queue(QueueName="orders-dead")
    source = admin.create_queue(QueueName="audit-source")["QueueUrl"]
    admin.create_queue(QueueName="audit-dead")

    def policy(target: str) -> dict[str, str]:
        arn = f"arn:aws:sqs:eu-west-1:000000000000:{target}"
        return {"RedrivePolicy": f'{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": 3}}'}

    # admin on audit-* only: its dead letters may not be sent into orders-dead
    assert _code(lambda: auditor.set_queue_attributes(QueueUrl=source, Attributes=policy("orders-dead"))) == (
        "AccessDenied",
        403,
    )
    assert _code(lambda: auditor.create_queue(QueueName="audit-other", Attributes=policy("orders-dead"))) == (
        "AccessDenied",
        403,
    )
    assert (
        "RedrivePolicy"
        not in admin.get_queue_attributes(QueueUrl=source, AttributeNames=["All"])["Attributes"]
    )
    assert "audit-other" not in _topics(secure)
    auditor.set_queue_attributes(QueueUrl=source, Attributes=policy("audit-dead"))  # admin on it is enough
    stored = admin.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert "audit-dead" in stored["RedrivePolicy"]


def test_the_aws_cli_signs_with_the_credentials_the_cli_printed(secure: Cluster) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", "sqs-credentials", "--url", secure.url("n1")],
        env={**os.environ, "RAFTMQ_TOKEN": TOKENS["admin"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    env = {**os.environ, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    env.update(line.split("=", 1) for line in out.splitlines())
    aws = [
        str(Path(sys.executable).parent / "aws"),
        "sqs",
        "--endpoint-url",
        secure.url("n2"),
        "--output",
        "json",
    ]
    created = subprocess.run(
        [*aws, "create-queue", "--queue-name", "orders-cli"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    env["AWS_SECRET_ACCESS_KEY"] += "x"
    refused = subprocess.run([*aws, "list-queues"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "SignatureDoesNotMatch" in refused.stderr


def test_tags_need_admin_on_the_queue_and_listing_them_any_right(secure: Cluster, tmp_path: Path) -> None:
    admin = _client(secure, "admin")
    url = admin.create_queue(QueueName="orders-tagged", tags={"team": "a"})["QueueUrl"]
    producer, consumer, auditor = (_client(secure, n, "n3") for n in ("producer", "consumer", "auditor"))
    denied = ("AccessDenied", 403)
    for client in (producer, consumer, auditor):
        for call in (
            lambda client=client: client.tag_queue(QueueUrl=url, Tags={"team": "b"}),
            lambda client=client: client.untag_queue(QueueUrl=url, TagKeys=["team"]),
            lambda client=client: client.create_queue(QueueName="orders-tags-new", tags={"a": "b"}),
            lambda client=client: client.add_permission(
                QueueUrl=url, Label="l", AWSAccountIds=["111122223333"], Actions=["SendMessage"]
            ),
            lambda client=client: client.remove_permission(QueueUrl=url, Label="l"),
        ):
            assert _code(call) == denied
    assert producer.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}
    assert consumer.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}
    assert _code(lambda: auditor.list_queue_tags(QueueUrl=url)) == denied  # no right on it at all
    query = query_sqs_client(secure.url("n2"), tmp_path, _credentials(secure, "producer"), region="eu-west-1")
    assert _code(lambda: query.tag_queue(QueueUrl=url, Tags={"team": "b"})) == denied
    assert query.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}
    assert "orders-tags-new" not in _topics(secure)

    # An admin of the queue tags it, on both wires; the permission actions stay refused for it.
    admin.tag_queue(QueueUrl=url, Tags={"team": "b", "tier": "1"})
    admin_query = query_sqs_client(
        secure.url("n2"), tmp_path, _credentials(secure, "admin"), region="eu-west-1"
    )
    admin_query.untag_queue(QueueUrl=url, TagKeys=["tier"])
    assert admin.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "b"}
    assert _code(lambda: admin.remove_permission(QueueUrl=url, Label="l")) == (
        "AWS.SimpleQueueService.UnsupportedOperation",
        400,
    )


def _signed(c: Cluster, name: str, path: str, body: bytes, headers: dict[str, str]) -> requests.Response:
    """A POST signed with the token ``name``'s SQS credentials by botocore's own signer."""
    key_id, secret = _credentials(c, name)
    request = AWSRequest(method="POST", url=c.url("n1") + path, data=body, headers=headers)
    SigV4Auth(Credentials(key_id, secret), "sqs", "eu-west-1").add_auth(request)
    prepared = request.prepare()
    return requests.post(prepared.url, data=prepared.body, headers=dict(prepared.headers), timeout=10)


def test_an_unknown_action_signed_by_any_token_is_invalid_action_and_touches_nothing(secure: Cluster) -> None:
    for name in ("admin", "auditor"):  # admin of every queue; no right on the queue named
        r = _signed(
            secure,
            name,
            "/",
            b'{"QueueName": "orders-unknown", "QueueUrl": "orders-unknown"}',
            {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueues"},
        )
        assert r.status_code == 400 and r.headers["x-amzn-query-error"] == "InvalidAction;Sender", r.text
        r = _signed(
            secure,
            name,
            "/000000000000/orders-unknown",
            b"Action=DeleteQueues&QueueName=orders-unknown",
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 400 and "<Code>InvalidAction</Code>" in r.text, r.text
    assert "orders-unknown" not in _topics(secure)


def test_the_rest_api_cannot_set_the_sqs_apis_attributes(secure: Cluster) -> None:
    """A RedrivePolicy PATCHed in as the topic attribute ``sqs.RedrivePolicy`` skipped every check
    SetQueueAttributes makes: receives then moved the auditor's queue's messages into
    ``orders-paid``, which the auditor may not produce to, and a value that is no policy made every
    receive an InternalError."""
    admin, auditor = _client(secure, "admin"), _client(secure, "auditor", "n2")
    paid = admin.create_queue(QueueName="orders-paid")["QueueUrl"]
    url = auditor.create_queue(QueueName="audit-patched")["QueueUrl"]
    arn = "arn:aws:sqs:eu-west-1:000000000000:orders-paid"
    as_auditor = {"Authorization": f"Bearer {TOKENS['auditor']}"}
    for attributes in (
        {"sqs.RedrivePolicy": f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":1}}'},
        {"sqs.RedrivePolicy": "not a policy"},
        {"sqs.CreatedTimestamp": None},
    ):
        for node in ("n1", "n3"):
            r = secure.session.patch(
                secure.url(node) + "/v1/topics/audit-patched",
                json={"attributes": attributes},
                headers=as_auditor,
                timeout=30,
            )
            assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_request"), r.text
    r = secure.post(
        "/v1/topics", {"name": "audit-made", "attributes": {"sqs.CreatedTimestamp": "1"}}, headers=as_auditor
    )
    assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_request"), r.text
    assert "audit-made" not in _topics(secure)
    assert (
        "RedrivePolicy"
        not in auditor.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    )
    admin.send_message(QueueUrl=url, MessageBody="stays here")
    for _ in range(2):  # received twice, not moved anywhere
        got = admin.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=5)["Messages"]
        assert [m["Body"] for m in got] == ["stays here"]
    assert "Messages" not in admin.receive_message(QueueUrl=paid, WaitTimeSeconds=1)
