"""The SQS API with the real boto3 against a real 3-node cluster (docs/sqs.md): round trips with
message attributes (boto3 checks the MD5s), AWS's errors, visibility, delays, long polling, batch
partial failures, queue attributes, purge, and the query protocol through botocore."""

from __future__ import annotations

import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import query_sqs_client, sqs_client


@pytest.fixture(scope="module")
def sqs(cluster: Cluster) -> Any:
    return sqs_client(cluster.url("n1"))


def _code(e: pytest.ExceptionInfo[ClientError]) -> str:
    code: str = e.value.response["Error"]["Code"]
    return code


def _status(e: pytest.ExceptionInfo[ClientError]) -> int:
    status: int = e.value.response["ResponseMetadata"]["HTTPStatusCode"]
    return status


def _receive_all(sqs: Any, url: str, want: int, timeout_s: float = 20, **kw: Any) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, **kw).get(
            "Messages", []
        )
    return got


def test_send_receive_delete_round_trip_with_attributes(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="round-trip")["QueueUrl"]
    assert url == f"{cluster.url('n1')}/000000000000/round-trip"
    assert sqs.get_queue_url(QueueName="round-trip")["QueueUrl"] == url
    attributes = {
        "city": {"DataType": "String", "StringValue": "Zürich"},
        "count": {"DataType": "Number", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xffraw"},
        "kind": {"DataType": "String.custom", "StringValue": "x"},
    }
    before_ms = int(time.time() * 1000)
    # boto3 raises if MD5OfMessageBody or MD5OfMessageAttributes do not match what it computes.
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo <world> & \u2603", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] and sent["MD5OfMessageAttributes"] and sent["MessageId"]
    got = sqs.receive_message(
        QueueUrl=url,
        WaitTimeSeconds=5,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
    )["Messages"]
    assert len(got) == 1
    m = got[0]
    assert m["Body"] == "héllo <world> & \u2603"
    assert m["MessageId"] == sent["MessageId"]
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["MessageAttributes"] == attributes
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert before_ms - 1000 <= int(m["Attributes"]["SentTimestamp"]) <= int(time.time() * 1000)
    # Only the named attributes come back (and the MD5 covers those: boto3 checks it).
    picked = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, MessageAttributeNames=["city"])
    assert picked.get("Messages", []) == []  # still in flight under the first receive
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    counts = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


def test_named_message_attributes_only_are_returned(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="attribute-names")["QueueUrl"]
    attributes = {
        "geo.city": {"DataType": "String", "StringValue": "Bern"},
        "geo.cost": {"DataType": "Number", "StringValue": "3.5"},
        "geology": {"DataType": "String", "StringValue": "x"},
        "other": {"DataType": "String", "StringValue": "y"},
    }
    sqs.send_message(QueueUrl=url, MessageBody="b", MessageAttributes=attributes)
    names = ["geo.*", "other"]  # a prefix ending in ".*", and a name
    m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, MessageAttributeNames=names)["Messages"][0]
    assert m["MessageAttributes"] == {k: v for k, v in attributes.items() if k != "geology"}
    assert "Attributes" not in m  # no system attribute was asked for


def test_errors_are_awss_and_change_nothing(sqs: Any, cluster: Cluster) -> None:
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as e:
        sqs.get_queue_url(QueueName="no-such-queue")
    assert _code(e) == "AWS.SimpleQueueService.NonExistentQueue" and _status(e) == 400
    missing = f"{cluster.url('n2')}/000000000000/no-such-queue"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=missing, MessageBody="x")
    for name in ("bad name!", "bad-newline\n"):  # "$" of the name's pattern once let the newline in
        with pytest.raises(ClientError) as e:
            sqs.create_queue(QueueName=name)
        assert _code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="bad-attribute", Attributes={"VisibilityTimeout": "43201"})
    assert _code(e) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="bad-attribute", Attributes={"NoSuchAttribute": "1"})
    assert _code(e) == "InvalidAttributeName"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="bad-attribute.fifo")  # a FIFO name needs FifoQueue true
    assert _code(e) == "InvalidParameterValue"
    assert not any("bad" in u for u in sqs.list_queues().get("QueueUrls", []))

    url = sqs.create_queue(QueueName="errors", Attributes={"VisibilityTimeout": "40"})["QueueUrl"]
    assert sqs.create_queue(QueueName="errors", Attributes={"VisibilityTimeout": "40"})["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists) as e:
        sqs.create_queue(QueueName="errors", Attributes={"VisibilityTimeout": "41"})
    assert _code(e) == "QueueAlreadyExists"
    with pytest.raises(ClientError) as e:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert _code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21)
    assert _code(e) == "InvalidParameterValue"
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid) as e:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert _status(e) == 404
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="bad \x00 char")
    assert _code(e) == "InvalidMessageContents"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", DelaySeconds=901)
    assert _code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.send_message(
            QueueUrl=url,
            MessageBody="x",
            MessageAttributes={"aws.x": {"DataType": "String", "StringValue": "v"}},
        )
    assert _code(e) == "InvalidParameterValue"
    # nothing of the refused sends was stored
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"
    ] == {"ApproximateNumberOfMessages": "0"}
    # A handle of another queue is not valid here.
    other = sqs.create_queue(QueueName="errors-other")["QueueUrl"]
    sqs.send_message(QueueUrl=other, MessageBody="y")
    handle = sqs.receive_message(QueueUrl=other, WaitTimeSeconds=5)["Messages"][0]["ReceiptHandle"]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)


def test_wire_errors_without_boto3(cluster: Cluster) -> None:
    json_type = {"Content-Type": "application/x-amz-json-1.0"}
    r = requests.post(
        cluster.url("n2") + "/", data=b"{}", headers={**json_type, "X-Amz-Target": "AmazonSQS.Nope"}
    )
    assert r.status_code == 400 and r.headers["x-amzn-query-error"] == "InvalidAction;Sender"
    assert r.json()["__type"] == "com.amazonaws.sqs#InvalidAction"
    r = requests.post(
        cluster.url("n2") + "/", data=b"[1", headers={**json_type, "X-Amz-Target": "AmazonSQS.ListQueues"}
    )
    assert r.status_code == 400 and r.json()["__type"].endswith("#SerializationException")
    r = requests.post(cluster.url("n2") + "/", data={"Action": "GetQueueUrl", "QueueName": "nope"})
    assert r.status_code == 400 and r.headers["Content-Type"].startswith("text/xml")
    assert "<Code>AWS.SimpleQueueService.NonExistentQueue</Code>" in r.text
    r = requests.post(
        cluster.url("n1") + "/000000000000/any",
        data=b"--x\r\nnot a part",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert r.status_code == 400 and "<Code>MalformedQueryString</Code>" in r.text, r.text
    for bad_url in ("http://[::1/000000000000/any", "http://[zz]/000000000000/any"):  # once a 500
        r = requests.post(
            cluster.url("n3") + "/",
            data=orjson.dumps({"QueueUrl": bad_url, "MessageBody": "x"}),
            headers={**json_type, "X-Amz-Target": "AmazonSQS.SendMessage"},
        )
        assert r.status_code == 404 and r.json()["__type"].endswith("#InvalidAddress"), r.text
        r = requests.post(cluster.url("n3") + "/", data={"Action": "DeleteQueue", "QueueUrl": bad_url})
        assert r.status_code == 404 and "<Code>InvalidAddress</Code>" in r.text, r.text
    still_the_console = requests.get(cluster.url("n2") + "/", allow_redirects=False)
    assert still_the_console.status_code == 302


def test_visibility_timeout_and_change_message_visibility(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="visibility")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="v")
    first = sqs.receive_message(
        QueueUrl=url,
        VisibilityTimeout=2,
        WaitTimeSeconds=5,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )["Messages"][0]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # in flight
    started = time.monotonic()
    second = sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=10, MessageSystemAttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert time.monotonic() - started <= 6  # back after its 2 s, not after a raftmq backoff
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    with pytest.raises(ClientError) as e:  # the old handle names a delivery that is over
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5)
    assert _code(e) == "AWS.SimpleQueueService.MessageNotInflight"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])  # accepted, deletes nothing
    # 0 makes it visible again at once
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0)
    third = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, VisibilityTimeout=1)["Messages"][0]
    assert third["Body"] == "v"
    # a longer timeout keeps it in flight past its first deadline
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"], VisibilityTimeout=30)
    time.sleep(2.5)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])


def test_queue_and_message_delays(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="delays", Attributes={"DelaySeconds": "2"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="queue delay")
    sqs.send_message(QueueUrl=url, MessageBody="no delay", DelaySeconds=0)
    now = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=3, MaxNumberOfMessages=10, VisibilityTimeout=60)
    assert [m["Body"] for m in now["Messages"]] == ["no delay"]
    started = time.monotonic()
    later = _receive_all(sqs, url, 1, timeout_s=10)
    assert [m["Body"] for m in later] == ["queue delay"]
    assert time.monotonic() - started <= 6


def test_long_poll_waits_and_wakes_on_a_send(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="long-poll", Attributes={"ReceiveMessageWaitTimeSeconds": "3"})[
        "QueueUrl"
    ]
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # the queue's default wait: 3 s
    waited = time.monotonic() - started
    assert 2.8 <= waited <= 8, waited
    other = sqs_client(cluster.url("n3"))
    timer = threading.Timer(1.5, lambda: other.send_message(QueueUrl=url, MessageBody="wake"))
    timer.start()
    started = time.monotonic()
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20)
    waited = time.monotonic() - started
    timer.join()
    assert [m["Body"] for m in got["Messages"]] == ["wake"]
    assert 1.0 <= waited <= 10, waited


def test_batches_and_their_partial_failures(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="batches")["QueueUrl"]
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {"Id": "b", "MessageBody": "bad \x01"},
            {
                "Id": "c",
                "MessageBody": "three",
                "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "3"}},
            },
        ],
    )
    assert sorted(s["Id"] for s in sent["Successful"]) == ["a", "c"]
    assert [(f["Id"], f["SenderFault"], f["Code"]) for f in sent["Failed"]] == [
        ("b", True, "InvalidMessageContents")
    ]
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"i{i}", "MessageBody": "x"} for i in range(11)])
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "same", "MessageBody": "x"}] * 2)
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "no spaces", "MessageBody": "x"}])
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[])
    got = _receive_all(sqs, url, 2, VisibilityTimeout=60)
    assert sorted(m["Body"] for m in got) == ["one", "three"]  # the refused batches stored nothing
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"]},
            {"Id": "y", "ReceiptHandle": "garbage"},
            {"Id": "z", "ReceiptHandle": got[1]["ReceiptHandle"]},
        ],
    )
    assert sorted(s["Id"] for s in deleted["Successful"]) == ["x", "z"]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesNotVisible"]) == (
        "0",
        "0",
    )


def test_a_handle_whose_numbers_overflow_fails_its_entry_only(sqs: Any) -> None:
    """A handle of the queue whose offset or token is 2^64 or more failed the whole batch (400,
    from the receipts' parser) and settled none of its other entries; AWS fails that entry only."""
    url = sqs.create_queue(QueueName="overflowing-handles")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": i, "MessageBody": i} for i in "abcd"])
    got = [m["ReceiptHandle"] for m in _receive_all(sqs, url, 4, VisibilityTimeout=60)]
    topic, queue, offset, token = got[0].split(".")
    overflowing = [f"{topic}.{queue}.{2**64}.{token}", f"{topic}.{queue}.{offset}.{2**64}"]
    for handle in overflowing:
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid) as e:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
        assert _status(e) == 404  # AWS's status for it (docs/sqs.md, Errors)
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "x", "ReceiptHandle": got[0], "VisibilityTimeout": 120},
            {"Id": "y", "ReceiptHandle": overflowing[0], "VisibilityTimeout": 0},
        ],
    )
    assert [s["Id"] for s in changed["Successful"]] == ["x"]
    assert [(f["Id"], f["SenderFault"], f["Code"]) for f in changed["Failed"]] == [
        ("y", True, "ReceiptHandleIsInvalid")
    ]
    entries = [(got[1], "x"), (overflowing[0], "y"), (overflowing[1], "z"), (got[2], "w")]
    deleted = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": i, "ReceiptHandle": h} for h, i in entries]
    )
    assert sorted(s["Id"] for s in deleted["Successful"]) == ["w", "x"]
    assert sorted((f["Id"], f["SenderFault"], f["Code"]) for f in deleted["Failed"]) == [
        ("y", True, "ReceiptHandleIsInvalid"),
        ("z", True, "ReceiptHandleIsInvalid"),
    ]
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    assert counts["Attributes"] == {"ApproximateNumberOfMessagesNotVisible": "2"}  # the 1st and the 4th


def test_change_visibility_batch(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="visibility-batch")["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "a"}, {"Id": "b", "MessageBody": "b"}]
    )
    got = _receive_all(sqs, url, 2, VisibilityTimeout=60)
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "b", "ReceiptHandle": got[1]["ReceiptHandle"], "VisibilityTimeout": 43201},
        ],
    )
    assert [s["Id"] for s in changed["Successful"]] == ["a"]
    assert [(f["Id"], f["Code"]) for f in changed["Failed"]] == [("b", "InvalidParameterValue")]
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in again] == [got[0]["Body"]]


def test_queue_attributes_list_purge_and_delete(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="settings")["QueueUrl"]
    defaults = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert defaults["VisibilityTimeout"] == "30" and defaults["DelaySeconds"] == "0"
    assert defaults["MessageRetentionPeriod"] == "345600" and defaults["ReceiveMessageWaitTimeSeconds"] == "0"
    assert defaults["MaximumMessageSize"] == "1048576"
    assert defaults["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:settings"  # [sqs] region
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={"VisibilityTimeout": "5", "MaximumMessageSize": "1024", "MessageRetentionPeriod": "60"},
    )
    changed = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout", "MaximumMessageSize", "MessageRetentionPeriod"]
    )["Attributes"]
    assert changed == {"VisibilityTimeout": "5", "MaximumMessageSize": "1024", "MessageRetentionPeriod": "60"}
    # the settings are the cluster's: another node answers the same
    assert sqs_client(cluster.url("n3")).get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout"]
    )["Attributes"] == {"VisibilityTimeout": "5"}
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1025)
    assert _code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "59"})
    assert _code(e) == "InvalidAttributeValue"
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)])
    in_flight = _receive_all(sqs, url, 1)
    assert in_flight
    sqs.purge_queue(QueueUrl=url)
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesNotVisible"]) == (
        "0",
        "0",
    )
    time.sleep(5.5)  # past the 5 s visibility of the purged in-flight message
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="settings")
    assert cluster.get("/v1/topics/settings").status_code == 404  # the topic is gone with it


def test_list_queues_prefix_and_pages(sqs: Any, cluster: Cluster) -> None:
    names = [f"listed-{i:02d}" for i in range(5)]
    for name in names:
        sqs.create_queue(QueueName=name)
    cluster.create_topic("listed-plain-topic")  # a raftmq topic is not an SQS queue
    listed = sqs.list_queues(QueueNamePrefix="listed-")["QueueUrls"]
    assert [urllib.parse.urlsplit(u).path.rsplit("/", 1)[1] for u in listed] == names
    pages, token = [], None
    while True:
        kw = {"NextToken": token} if token else {}
        page = sqs.list_queues(QueueNamePrefix="listed-", MaxResults=2, **kw)
        pages.append([u.rsplit("/", 1)[1] for u in page.get("QueueUrls", [])])
        token = page.get("NextToken")
        if not token:
            break
    assert pages == [names[0:2], names[2:4], names[4:5]]
    assert sqs.list_queues(QueueNamePrefix="listed-zzz").get("QueueUrls", []) == []
    # the URLs name the node that answered
    on_n2 = sqs_client(cluster.url("n2")).list_queues(QueueNamePrefix="listed-00")["QueueUrls"]
    assert on_n2 == [f"{cluster.url('n2')}/000000000000/listed-00"]


def test_query_protocol_through_botocore(cluster: Cluster, tmp_path: Path) -> None:
    sqs = query_sqs_client(cluster.url("n2"), tmp_path)
    url = sqs.create_queue(QueueName="query-wire", Attributes={"VisibilityTimeout": "7"})["QueueUrl"]
    assert url == f"{cluster.url('n2')}/000000000000/query-wire"
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"] == {
        "VisibilityTimeout": "7"
    }
    attributes = {"k": {"DataType": "String", "StringValue": "v & <w>"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="<xml> & text", MessageAttributes=attributes)
    got = sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"], MessageAttributeNames=["All"]
    )["Messages"][0]
    assert got["Body"] == "<xml> & text" and got["MessageId"] == sent["MessageId"]
    assert got["MessageAttributes"] == attributes
    assert got["Attributes"]["ApproximateReceiveCount"] == "1"
    batch = sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "ok", "MessageBody": "fine"}, {"Id": "bad", "MessageBody": "\x02"}]
    )
    assert [s["Id"] for s in batch["Successful"]] == ["ok"] and [f["Id"] for f in batch["Failed"]] == ["bad"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
    with pytest.raises(ClientError) as e:
        sqs.get_queue_url(QueueName="query-missing")
    assert _code(e) == "AWS.SimpleQueueService.NonExistentQueue" and _status(e) == 400
    listed = sqs.list_queues(QueueNamePrefix="query-")["QueueUrls"]
    assert listed == [url]


def test_the_boto3_example_of_the_docs_runs(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "sqs.md").read_text()
    block = text.split("<!-- sqs-example:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert 'endpoint_url="http://localhost:8081"' in block  # what ./scripts/dev serves
    exec(compile(block.replace("http://localhost:8081", cluster.url("n2")), "docs/sqs.md", "exec"), {})
    printed = capsys.readouterr().out
    assert (
        printed.count('{"order": ') == 11
        and "'customer'" in printed
        and "ApproximateNumberOfMessages" in printed
    )
    assert cluster.get("/v1/topics/emails").status_code == 404  # the example deletes its queue
