"""The SQS adapter's pure parts: AWS's MD5 of message attributes (a vector from a real AWS
answer), the query protocol's flattened members, XML answers that escape what clients sent, and
the checks of queue and message attributes, a received message's system attributes."""

from __future__ import annotations

import json
import uuid

import orjson
import pytest

from raftmq.cluster.api.sqs.actions import int_param
from raftmq.cluster.api.sqs.errors import SqsError, quoted
from raftmq.cluster.api.sqs.message_actions import sqs_message
from raftmq.cluster.api.sqs.messages import (
    attributes_from_header,
    attributes_md5,
    body_md5,
    message_ids,
    parse_message_attributes,
    stored_attributes,
)
from raftmq.cluster.api.sqs.queues import check_attributes
from raftmq.cluster.api.sqs.wire import query_answer, query_params


def test_md5s_match_a_real_aws_answer() -> None:
    # An SQS event as AWS delivered it: body "Sample content.", one String attribute.
    assert body_md5("Sample content.") == "b58e1d0a86521415d25b85b89f6ad6cd"
    assert (
        attributes_md5({"sample-attribute": ("String", "sample-value")}) == "7c815262be77a62f56671125069ca888"
    )


def test_attribute_md5_depends_on_order_free_content_and_transport_type() -> None:
    a = {"b": ("String", "1"), "a": ("Number", "2")}
    assert attributes_md5(a) == attributes_md5(dict(reversed(list(a.items()))))
    assert attributes_md5({"x": ("Binary", b"1")}) != attributes_md5({"x": ("Binary", "1")})


def test_stored_attributes_come_back_the_same() -> None:
    parsed = parse_message_attributes(
        {"s": {"DataType": "String", "StringValue": "é"}, "b": {"DataType": "Binary", "BinaryValue": "AP8="}}
    )
    assert parsed == {"s": ("String", "é"), "b": ("Binary", b"\x00\xff")}
    assert attributes_from_header(stored_attributes(parsed)) == parsed
    assert (
        attributes_from_header("not json") == {} and attributes_from_header(orjson.dumps([1]).decode()) == {}
    )


def test_a_forged_attributes_header_keeps_only_what_send_message_could_have_stored() -> None:
    """Any REST producer can write ``sqs-attributes``: entries SendMessage could not have stored
    are left out, so the receive that renders the message (its MD5 above all) cannot fail."""
    forged = {
        "ok": ["String", "v"],
        "bin": ["Binary", "AP8="],
        "number-value": ["String", 5],
        "short": ["String"],
        "not-a-list": "String",
        "bad-type": ["Text", "v"],
        "bad-base64": ["Binary", "%%%"],
    }
    kept = attributes_from_header(orjson.dumps(forged).decode())
    assert kept == {"ok": ("String", "v"), "bin": ("Binary", b"\x00\xff")}
    assert len(attributes_md5(kept)) == 32
    assert attributes_from_header(orjson.dumps({"x": None}).decode()) == {}


@pytest.mark.parametrize(
    "raw",
    [
        {"AWS.x": {"DataType": "String", "StringValue": "v"}},
        {".x": {"DataType": "String", "StringValue": "v"}},
        {"a..b": {"DataType": "String", "StringValue": "v"}},
        {"x": {"DataType": "Text", "StringValue": "v"}},
        {"x": {"DataType": "Number", "StringValue": "twelve"}},
        {"x": {"DataType": "Number", "StringValue": "\u0663"}},  # an Arabic-Indic 3: AWS takes ASCII digits
        {"x": {"DataType": "String", "StringValue": ""}},
        {"x": {"DataType": "Binary", "BinaryValue": "%%%"}},
        {f"k{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
    ],
)
def test_bad_message_attributes_are_invalid_parameter_values(raw: object) -> None:
    with pytest.raises(SqsError) as e:
        parse_message_attributes(raw)
    assert e.value.aws.code == "InvalidParameterValue"


def test_query_members_become_the_json_shape() -> None:
    action, params = query_params(
        {
            "Action": "SendMessageBatch",
            "Version": "2012-11-05",
            "QueueUrl": "http://h/000000000000/q",
            "SendMessageBatchRequestEntry.2.Id": "b",
            "SendMessageBatchRequestEntry.2.MessageBody": "two",
            "SendMessageBatchRequestEntry.1.Id": "a",
            "SendMessageBatchRequestEntry.1.MessageBody": "one",
            "SendMessageBatchRequestEntry.1.DelaySeconds": "5",
            "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name": "k",
            "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType": "String",
            "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue": "v",
        }
    )
    assert action == "SendMessageBatch"
    assert params == {
        "QueueUrl": "http://h/000000000000/q",
        "Entries": [
            {
                "Id": "a",
                "MessageBody": "one",
                "DelaySeconds": 5,
                "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
            },
            {"Id": "b", "MessageBody": "two"},
        ],
    }
    _, params = query_params(
        {
            "Action": "CreateQueue",
            "Attribute.1.Name": "DelaySeconds",
            "Attribute.1.Value": "3",
            "AttributeName.1": "All",
        }
    )
    assert params == {"Attributes": {"DelaySeconds": "3"}, "AttributeNames": ["All"]}
    with pytest.raises(SqsError):
        query_params({"QueueName": "q"})


ARABIC_30 = "\u0663\u0660"  # digits to Python's \\d and int(), not to AWS


def test_an_entry_field_naming_entries_again_is_an_unknown_field_not_a_recursion() -> None:
    """Read as entries at every level, 2,000 of them ran out of Python's stack (an InternalError)."""
    nested = "SendMessageBatchRequestEntry.1." * 2000 + "Id"
    _, params = query_params(
        {"Action": "SendMessageBatch", nested: "a", "SendMessageBatchRequestEntry.1.Id": "b"}
    )
    (entry,) = params["Entries"]
    assert entry == {"Id": "b", nested.split(".", 2)[2]: "a"}


def test_a_nested_value_where_a_number_belongs_is_quoted_by_its_type() -> None:
    """``str()`` of an array 1,000 deep (the JSON wire's parser reads 1,024) ran out of Python
    3.11's stack; later Pythons' ``str()`` reads deeper, so the test's array is 50,000 deep, past
    every supported Python's (checked first, or the test could not fail)."""
    deep: list[object] = []
    for _ in range(50_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        str(deep)
    with pytest.raises(SqsError) as e:
        int_param({"MaxResults": deep}, "MaxResults", 1, 1000, 1000)
    assert e.value.message.startswith("Value (an array) for parameter MaxResults is invalid.")
    assert quoted({"a": 1}) == "(an object)" and quoted(None) == "null" and quoted(True) == "true"
    assert quoted(12) == "12" and quoted("x" * 300) == "x" * 300


def test_numbers_are_ascii_digits_only() -> None:
    """A number in other scripts' digits is refused (or left as text) wherever AWS takes a number."""
    _, params = query_params({"Action": "ReceiveMessage", "QueueUrl": "u", "WaitTimeSeconds": ARABIC_30})
    assert params["WaitTimeSeconds"] == ARABIC_30  # text, which the action refuses as not a number
    with pytest.raises(SqsError) as e:
        int_param(params, "WaitTimeSeconds", 0, 20, 0)
    assert e.value.aws.code == "InvalidParameterValue"
    # An entry's index: not an entry, an unknown parameter the action refuses.
    _, params = query_params({"Action": "SendMessageBatch", "SendMessageBatchRequestEntry.\u0661.Id": "a"})
    assert params == {"SendMessageBatchRequestEntry.\u0661.Id": "a"}
    with pytest.raises(SqsError) as e:
        check_attributes({"VisibilityTimeout": ARABIC_30}, 1 << 20)
    assert e.value.aws.code == "InvalidAttributeValue"
    policy = f'{{"deadLetterTargetArn": "{ARN}dlq", "maxReceiveCount": "\u0665"}}'
    with pytest.raises(SqsError) as e:
        check_attributes({"RedrivePolicy": policy}, 1 << 20, "eu-west-1")
    assert e.value.aws.code == "InvalidParameterValue"


def test_xml_answers_escape_what_clients_sent() -> None:
    answer = query_answer(
        "ReceiveMessage", {"Messages": [{"Body": "<a>&</a>", "MessageAttributes": {}}]}, "r"
    )
    assert answer.body is not None
    text = bytes(answer.body).decode()  # type: ignore[arg-type]
    assert "<Message><Body>&lt;a&gt;&amp;&lt;/a&gt;</Body></Message>" in text


def test_queue_attributes_are_checked_against_awss_bounds() -> None:
    assert check_attributes({"VisibilityTimeout": "0", "DelaySeconds": "900"}, 1 << 20) == {
        "sqs.VisibilityTimeout": "0",
        "sqs.DelaySeconds": "900",
    }
    for bad in ({"VisibilityTimeout": "43201"}, {"MessageRetentionPeriod": "59"}, {"DelaySeconds": "-1"}):
        with pytest.raises(SqsError) as e:
            check_attributes(bad, 1 << 20)
        assert e.value.aws.code == "InvalidAttributeValue"
    with pytest.raises(SqsError) as e:
        check_attributes({"MaximumMessageSize": "2048"}, 1024)  # above the node's own limit
    assert e.value.aws.code == "InvalidAttributeValue"
    for name in ("FifoQueue", "Nope"):
        with pytest.raises(SqsError) as e:
            check_attributes({name: "1"}, 1 << 20)
        assert e.value.aws.code == "InvalidAttributeName"


ARN = "arn:aws:sqs:eu-west-1:000000000000:"


def test_redrive_policies_are_checked_and_kept_normalized() -> None:
    given = f'{{ "maxReceiveCount": "5", "deadLetterTargetArn": "{ARN}dlq" }}'
    assert check_attributes({"RedrivePolicy": given}, 1 << 20, "eu-west-1") == {
        "sqs.RedrivePolicy": f'{{"deadLetterTargetArn":"{ARN}dlq","maxReceiveCount":5}}'
    }
    assert check_attributes({"RedrivePolicy": ""}, 1 << 20, "eu-west-1") == {"sqs.RedrivePolicy": ""}
    allow = f'{{"redrivePermission": "byQueue", "sourceQueueArns": ["{ARN}a"]}}'
    assert check_attributes({"RedriveAllowPolicy": allow}, 1 << 20, "eu-west-1") == {
        "sqs.RedriveAllowPolicy": f'{{"redrivePermission":"byQueue","sourceQueueArns":["{ARN}a"]}}'
    }
    bad_policies = [
        "1",
        "{",
        "[]",
        f'{{"deadLetterTargetArn": "{ARN}dlq"}}',
        f'{{"deadLetterTargetArn": "{ARN}dlq", "maxReceiveCount": 0}}',
        f'{{"deadLetterTargetArn": "{ARN}dlq", "maxReceiveCount": 1001}}',
        f'{{"deadLetterTargetArn": "{ARN}dlq", "maxReceiveCount": true}}',
        f'{{"deadLetterTargetArn": "{ARN}dlq", "maxReceiveCount": 5, "x": 1}}',
        '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "maxReceiveCount": 5}',
        '{"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:123456789012:dlq", "maxReceiveCount": 5}',
        f'{{"deadLetterTargetArn": "{ARN}bad.name", "maxReceiveCount": 5}}',
    ]
    for bad in bad_policies:
        with pytest.raises(SqsError) as e:
            check_attributes({"RedrivePolicy": bad}, 1 << 20, "eu-west-1")
        assert e.value.aws.code == "InvalidParameterValue", bad
    bad_allows = [
        '{"redrivePermission": "some"}',
        f'{{"redrivePermission": "allowAll", "sourceQueueArns": ["{ARN}a"]}}',
        '{"redrivePermission": "byQueue"}',
        '{"redrivePermission": "byQueue", "sourceQueueArns": []}',
        '{"redrivePermission": "byQueue", "sourceQueueArns": ["arn:nope"]}',
        json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [f"{ARN}q{i}" for i in range(11)]}),
    ]
    for bad in bad_allows:
        with pytest.raises(SqsError) as e:
            check_attributes({"RedriveAllowPolicy": bad}, 1 << 20, "eu-west-1")
        assert e.value.aws.code == "InvalidParameterValue", bad


def test_query_tags_read_as_the_json_protocols_members() -> None:
    form = {"Tag.1.Key": "team", "Tag.1.Value": "a", "Tag.2.Key": "../x", "Tag.2.Value": ""}
    assert query_params({"Action": "TagQueue", **form}) == ("TagQueue", {"Tags": {"team": "a", "../x": ""}})
    assert query_params({"Action": "CreateQueue", "QueueName": "q", **form})[1] == {
        "QueueName": "q",
        "tags": {"team": "a", "../x": ""},
    }
    assert query_params({"Action": "UntagQueue", "TagKey.2": "b", "TagKey.1": "a"})[1] == {
        "TagKeys": ["a", "b"]
    }


def test_the_first_receive_timestamp_is_the_first_delivery_or_else_this_receive_when_first() -> None:
    first = "ApproximateFirstReceiveTimestamp"
    taken = {"receipt": "1.0.5.9", "queue": 0, "offset": 5, "timestamp_ms": 500, "headers": {}, "value": "b"}
    # The leader says when the message was first handed out (kept through redeliveries).
    m = sqs_message(
        {**taken, "attempt": 3, "deadline_ms": 61_000, "first_delivery_ms": 700}, {first}, [], 30_000
    )
    assert m["Attributes"] == {first: "700"}
    everything = sqs_message(
        {**taken, "attempt": 1, "deadline_ms": 31_000, "first_delivery_ms": 1_000}, {"All"}, [], 30_000
    )
    assert everything["Attributes"] == {
        "SentTimestamp": "500",
        "ApproximateReceiveCount": "1",
        "SenderId": "000000000000",
        first: "1000",
    }
    # A leader of the release before the field: a first delivery is this receive (its deadline
    # less the visibility it was taken for); a redelivery's first time is not known, not invented.
    old_first = sqs_message({**taken, "attempt": 1, "deadline_ms": 31_000}, {first}, [], 30_000)
    assert old_first["Attributes"] == {first: "1000"}
    assert "Attributes" not in sqs_message(
        {**taken, "attempt": 2, "deadline_ms": 61_000}, {first}, [], 30_000
    )
    assert "Attributes" not in sqs_message({**taken, "attempt": 1, "deadline_ms": 31_000}, set(), [], 30_000)


def test_message_ids_are_distinct_version_4_uuids_in_their_text_form() -> None:
    ids = message_ids(500)
    assert len(set(ids)) == 500
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lower-case hex, dashes where a UUID has them
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert message_ids(0) == []
