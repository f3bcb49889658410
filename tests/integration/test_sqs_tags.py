"""Queue tags, the permission actions and the actions raftmq does not have, with the real boto3 (JSON
protocol) and botocore forced to the query protocol against a real 3-node cluster (docs/sqs.md):
TagQueue, UntagQueue, ListQueueTags and CreateQueue's tags with AWS's semantics and limits,
replicated with the queue and kept apart from its attributes; AddPermission and RemovePermission
refused with UnsupportedOperation; an unknown action refused with InvalidAction; a request posted
to a queue's URL acts on that queue only. Every refusal changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError

from .harness import Cluster, wait_until
from .sqs_clients import query_sqs_client, sqs_client

JSON_HEADERS = {"Content-Type": "application/x-amz-json-1.0"}


@pytest.fixture(scope="module")
def sqs(cluster: Cluster) -> Any:
    return sqs_client(cluster.url("n1"))


def _code(call: Callable[[], Any]) -> tuple[str, int]:
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def _topic_names(c: Cluster) -> set[str]:
    return {t["name"] for t in c.get("/v1/topics").json()["topics"]}


def test_tags_are_set_overwritten_removed_and_listed_as_aws_does(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="tagged", tags={"team": "billing", "cost-center": "42"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing", "cost-center": "42"}
    # An existing key is overwritten, keys are case-sensitive, a value may be empty, and the
    # characters AWS allows (Unicode letters, digits, spaces, _ . : / = + - @) are kept as given.
    sqs.tag_queue(
        QueueUrl=url, Tags={"team": "payments", "Team": "other", "empty": "", "Zürich x_.:/=+-@": "ä 1"}
    )
    want = {"team": "payments", "Team": "other", "empty": "", "cost-center": "42", "Zürich x_.:/=+-@": "ä 1"}
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == want
    # Untagging a key the queue does not have is fine; the others go.
    sqs.untag_queue(QueueUrl=url, TagKeys=["Team", "never-set", "empty"])
    del want["Team"], want["empty"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == want
    # Replicated with the queue: every node's answer (through its own replica) shows them.
    for node in ("n2", "n3"):
        other = sqs_client(cluster.url(node))
        wait_until(
            lambda other=other: other.list_queue_tags(QueueUrl=url).get("Tags") == want,
            10,
            what=f"the tags on {node}",
        )
    sqs.untag_queue(QueueUrl=url, TagKeys=list(want))
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)  # AWS leaves Tags out when none


def test_a_tag_key_cannot_reach_an_attribute_or_the_queue_marker(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="tag-names", Attributes={"VisibilityTimeout": "40"})["QueueUrl"]
    before = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    names = {
        "VisibilityTimeout": "0",
        "sqs.VisibilityTimeout": "0",
        "sqs.CreatedTimestamp": "1",
        "../x": "y",
        "/sqs.DelaySeconds": "900",
        "MessageRetentionPeriod": "60",
    }
    sqs.tag_queue(QueueUrl=url, Tags=names)
    after = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: v for k, v in after.items() if not k.startswith("Approximate")} == {
        k: v for k, v in before.items() if not k.startswith("Approximate")
    }
    assert after["VisibilityTimeout"] == "40" and after["DelaySeconds"] == "0"
    sqs.untag_queue(QueueUrl=url, TagKeys=["sqs.CreatedTimestamp", "sqs.VisibilityTimeout"])
    sqs.get_queue_url(QueueName="tag-names")  # still a queue: its marker is an attribute, not a tag
    topic = cluster.get("/v1/topics/tag-names").json()
    assert topic["tags"] == {k: v for k, v in names.items() if not k.startswith("sqs.")}
    assert topic["attributes"]["sqs.VisibilityTimeout"] == "40"


def test_bad_tags_are_refused_with_awss_codes_and_change_nothing(sqs: Any, cluster: Cluster) -> None:
    url = sqs.create_queue(QueueName="tag-limits", tags={"keep": "me"})["QueueUrl"]
    bad_value = ("InvalidParameterValue", 400)
    for tags in (
        {f"k{i}": "v" for i in range(51)},  # more than 50 in one call
        {f"k{i}": "v" for i in range(50)},  # 50 more than the one there: 51 after the merge
        {"k" * 129: "v"},
        {"": "v"},
        {"k": "v" * 257},
        {"semi;colon": "v"},
        {"k": "tab\there"},
        {"k": "<script>"},
        {"aws:reserved": "v"},
        {"AWS:Reserved": "v"},
        {"k": "aws:v"},
    ):
        assert _code(lambda tags=tags: sqs.tag_queue(QueueUrl=url, Tags=tags)) == bad_value, tags
    assert _code(lambda: sqs.tag_queue(QueueUrl=url, Tags={})) == ("MissingParameter", 400)
    assert _code(lambda: sqs.untag_queue(QueueUrl=url, TagKeys=[])) == bad_value
    assert _code(lambda: sqs.untag_queue(QueueUrl=url, TagKeys=["k" * 129])) == bad_value
    assert _code(lambda: sqs.create_queue(QueueName="tag-never", tags={"aws:x": "v"})) == bad_value
    assert _code(lambda: sqs.create_queue(QueueName="tag-never", tags={f"k{i}": "" for i in range(51)})) == (
        bad_value
    )
    missing = url.replace("tag-limits", "tag-missing")
    for call in (
        lambda: sqs.tag_queue(QueueUrl=missing, Tags={"a": "b"}),
        lambda: sqs.untag_queue(QueueUrl=missing, TagKeys=["a"]),
        lambda: sqs.list_queue_tags(QueueUrl=missing),
    ):
        assert _code(call) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"keep": "me"}
    assert not {"tag-never", "tag-missing"} & _topic_names(cluster)
    # Exactly 50, keys of 128 and values of 256 characters, are kept.
    full = {"k" * 128: "v" * 256, **{f"k{i}": "" for i in range(48)}}
    sqs.tag_queue(QueueUrl=url, Tags=full)
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"keep": "me", **full}


def test_create_queue_again_with_other_tags_is_queue_already_exists(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="tag-again", tags={"a": "1"})["QueueUrl"]
    assert sqs.create_queue(QueueName="tag-again", tags={"a": "1"})["QueueUrl"] == url  # the same: fine
    assert sqs.create_queue(QueueName="tag-again")["QueueUrl"] == url  # none given: not compared
    for other in ({"a": "2"}, {"a": "1", "b": "2"}, {"b": "1"}):
        assert _code(lambda other=other: sqs.create_queue(QueueName="tag-again", tags=other)) == (
            "QueueAlreadyExists",
            400,
        )
    plain = sqs.create_queue(QueueName="tag-again-plain")["QueueUrl"]
    assert (
        _code(lambda: sqs.create_queue(QueueName="tag-again-plain", tags={"a": "1"}))[0]
        == "QueueAlreadyExists"
    )
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"a": "1"}
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=plain)


def test_tags_on_the_query_protocol(cluster: Cluster, tmp_path: Path) -> None:
    query = query_sqs_client(cluster.url("n2"), tmp_path)
    url = query.create_queue(QueueName="tag-query", tags={"team": "a", "x y": "z"})["QueueUrl"]
    assert query.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "x y": "z"}
    query.tag_queue(QueueUrl=url, Tags={"team": "b", "new": "ä/=+"})
    query.untag_queue(QueueUrl=url, TagKeys=["x y", "missing"])
    assert query.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "b", "new": "ä/=+"}
    assert sqs_client(cluster.url("n2")).list_queue_tags(QueueUrl=url)["Tags"] == {"team": "b", "new": "ä/=+"}
    assert _code(lambda: query.tag_queue(QueueUrl=url, Tags={"aws:x": "1"})) == ("InvalidParameterValue", 400)
    query.untag_queue(QueueUrl=url, TagKeys=["team", "new"])
    assert "Tags" not in query.list_queue_tags(QueueUrl=url)


def test_add_and_remove_permission_are_refused_on_both_wires(
    sqs: Any, cluster: Cluster, tmp_path: Path
) -> None:
    url = sqs.create_queue(QueueName="permissions")["QueueUrl"]
    query = query_sqs_client(cluster.url("n3"), tmp_path)
    unsupported = ("AWS.SimpleQueueService.UnsupportedOperation", 400)
    add = {"QueueUrl": url, "Label": "l", "AWSAccountIds": ["111122223333"], "Actions": ["SendMessage"]}
    with pytest.raises(sqs.exceptions.UnsupportedOperation):  # boto3's modeled exception
        sqs.add_permission(**add)
    for client in (sqs, query):
        assert _code(lambda client=client, add=add: client.add_permission(**add)) == unsupported
        assert _code(lambda client=client: client.remove_permission(QueueUrl=url, Label="l")) == unsupported
        missing = url.replace("permissions", "permissions-missing")
        assert _code(lambda client=client, m=missing: client.remove_permission(QueueUrl=m, Label="l")) == (
            "AWS.SimpleQueueService.NonExistentQueue",
            400,
        )
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def test_an_unknown_action_is_invalid_action_and_touches_nothing(cluster: Cluster) -> None:
    for target in ("AmazonSQS.NoSuchAction", "AmazonSQS.createqueue", "AmazonSQS.", "AmazonSQS.__init__"):
        r = requests.post(
            cluster.url("n1") + "/",
            data=b'{"QueueName": "unknown-action", "QueueUrl": "unknown-action"}',
            headers={**JSON_HEADERS, "X-Amz-Target": target},
            timeout=10,
        )
        assert r.status_code == 400 and r.headers["x-amzn-query-error"] == "InvalidAction;Sender", r.text
    for path in ("/", "/000000000000/unknown-action"):
        r = requests.post(
            cluster.url("n2") + path,
            data={"Action": "CreateQueues", "QueueName": "unknown-action"},
            timeout=10,
        )
        assert r.status_code == 400 and "<Code>InvalidAction</Code>" in r.text, r.text
    assert "unknown-action" not in _topic_names(cluster)


def test_a_request_posted_to_a_queue_url_acts_on_that_queue_only(sqs: Any, cluster: Cluster) -> None:
    posted = sqs.create_queue(QueueName="path-queue")["QueueUrl"]
    other = sqs.create_queue(QueueName="path-other")["QueueUrl"]
    path = cluster.url("n1") + "/000000000000/path-queue"
    for form in (
        {"Action": "SendMessage", "QueueUrl": other, "MessageBody": "x"},
        {"Action": "TagQueue", "QueueUrl": other, "Tag.1.Key": "k", "Tag.1.Value": "v"},
        {"Action": "GetQueueUrl", "QueueName": "path-other"},
        {"Action": "CreateQueue", "QueueName": "path-new"},
    ):
        r = requests.post(path, data=form, timeout=10)
        assert r.status_code == 404 and "<Code>InvalidAddress</Code>" in r.text, (form, r.text)
    r = requests.post(  # the JSON wire posted there too
        path,
        data=b'{"QueueUrl": "%s", "MessageBody": "x"}' % other.encode(),
        headers={**JSON_HEADERS, "X-Amz-Target": "AmazonSQS.SendMessage"},
        timeout=10,
    )
    assert r.status_code == 404 and r.headers["x-amzn-query-error"] == "InvalidAddress;Sender", r.text
    # The path's queue, named by the path alone or again by the form, is the one acted on.
    for form in (
        {"Action": "TagQueue", "Tag.1.Key": "k", "Tag.1.Value": "v"},
        {"Action": "SendMessage", "QueueUrl": posted, "MessageBody": "here"},
    ):
        r = requests.post(path, data=form, timeout=10)
        assert r.status_code == 200, r.text
    assert sqs.list_queue_tags(QueueUrl=posted)["Tags"] == {"k": "v"}
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=other)
    got = sqs.receive_message(QueueUrl=posted, WaitTimeSeconds=5)["Messages"]
    assert [m["Body"] for m in got] == ["here"]
    assert "Messages" not in sqs.receive_message(QueueUrl=other, WaitTimeSeconds=1)
    assert "path-new" not in _topic_names(cluster)
