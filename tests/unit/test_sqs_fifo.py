"""The SQS FIFO queue rules that need no cluster: the FIFO attributes and their combinations as
AWS checks them, and how a FIFO send becomes a ``dedup_produce`` message (message group as key,
the deduplication key by scope, content-based deduplication)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from raftmq.cluster import commands
from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.api.sqs.message_actions import _fifo_message, sequence_number
from raftmq.cluster.api.sqs.messages import (
    ATTRIBUTES_HEADER,
    DEDUP_HEADER,
    ID_HEADER,
    SOURCE_HEADER,
    moved_fifo,
    moved_headers,
)
from raftmq.cluster.api.sqs.queues import (
    FIFO_RELEASE,
    QUEUE_NAME,
    check_attributes,
    check_fifo_settings,
    needs_fifo_release,
)
from raftmq.cluster.machines.metadata import Topic


def _code(call: Any) -> str:
    with pytest.raises(SqsError) as e:
        call()
    return e.value.aws.code


def test_fifo_names_end_with_the_suffix_within_80_characters() -> None:
    assert QUEUE_NAME.match("orders.fifo") and QUEUE_NAME.match("a" * 75 + ".fifo")
    assert not QUEUE_NAME.match("a" * 76 + ".fifo") and not QUEUE_NAME.match(".fifo")
    assert not QUEUE_NAME.match("a.b") and not QUEUE_NAME.match("a.fifo.fifo")


def test_fifo_attributes_are_kept_for_a_fifo_queue_and_unknown_to_a_standard_one() -> None:
    given = {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
    }
    assert check_attributes(given, 1 << 20, fifo=True, creating=True) == {
        "sqs.FifoQueue": "true",
        "sqs.ContentBasedDeduplication": "true",
        "sqs.DeduplicationScope": "messageGroup",
        "sqs.FifoThroughputLimit": "perMessageGroupId",
    }
    assert check_attributes({"FifoQueue": "false"}, 1 << 20, creating=True) == {}
    for name in ("ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"):
        assert _code(lambda n=name: check_attributes({n: "true"}, 1 << 20)) == "InvalidAttributeName"
    # FifoQueue only at creation (SetQueueAttributes cannot change a queue's type).
    assert (
        _code(lambda: check_attributes({"FifoQueue": "true"}, 1 << 20, fifo=True)) == "InvalidAttributeName"
    )
    for bad in (
        {"FifoQueue": "yes"},
        {"ContentBasedDeduplication": "1"},
        {"DeduplicationScope": "group"},
        {"FifoThroughputLimit": "perGroup"},
        {"DelaySeconds": "901"},
    ):
        assert (
            _code(lambda b=bad: check_attributes(b, 1 << 20, fifo=True, creating=True))
            == "InvalidAttributeValue"
        )


def test_a_fifo_queue_has_a_delay_of_0_to_900_seconds_as_a_standard_one() -> None:
    assert check_attributes({"DelaySeconds": "900"}, 1 << 20, fifo=True, creating=True) == {
        "sqs.DelaySeconds": "900"
    }
    assert check_attributes({"DelaySeconds": "5"}, 1 << 20, fifo=True) == {"sqs.DelaySeconds": "5"}


def test_per_message_group_throughput_needs_the_message_group_scope() -> None:
    check_fifo_settings(
        {"sqs.FifoThroughputLimit": "perMessageGroupId", "sqs.DeduplicationScope": "messageGroup"}
    )
    check_fifo_settings({"sqs.DeduplicationScope": "messageGroup"})
    check_fifo_settings({})
    assert (
        _code(lambda: check_fifo_settings({"sqs.FifoThroughputLimit": "perMessageGroupId"}))
        == "InvalidAttributeValue"
    )
    assert (
        _code(
            lambda: check_fifo_settings(
                {"sqs.FifoThroughputLimit": "perMessageGroupId", "sqs.DeduplicationScope": "queue"}
            )
        )
        == "InvalidAttributeValue"
    )


def _topic(**attributes: str) -> Topic:
    return Topic.from_json(
        {
            "name": "q.fifo",
            "id": 7,
            "queues": 1,
            "queue_groups": [0],
            "retention_ms": None,
            "retention_bytes": None,
            "max_message_bytes": None,
            "created_ms": 1,
            "attributes": {"sqs.CreatedTimestamp": "1", "sqs.FifoQueue": "true", **attributes},
        }
    )


def test_a_fifo_send_needs_a_group_and_a_deduplication_id_or_content_based_deduplication() -> None:
    headers = {"sqs-id": "m1"}
    topic = _topic()
    assert _code(lambda: _fifo_message(topic, {}, "b", headers, 1000)) == "MissingParameter"
    assert (
        _code(lambda: _fifo_message(topic, {"MessageGroupId": "g"}, "b", headers, 1000))
        == "InvalidParameterValue"
    )
    for bad in ("", "x" * 129, "a b", "é"):
        entry = {"MessageGroupId": bad, "MessageDeduplicationId": "d"}
        assert _code(lambda e=entry: _fifo_message(topic, e, "b", headers, 1000)) == "InvalidParameterValue"
    sent = _fifo_message(topic, {"MessageGroupId": "g", "MessageDeduplicationId": "d-1"}, "b", headers, 1000)
    assert sent == {
        "value": "b",
        "key": "g",
        "headers": {"sqs-id": "m1", DEDUP_HEADER: "d-1"},
        "ttl_ms": 1000,
        "dedup": "q:d-1",
        "id": "m1",
    }


def test_content_based_deduplication_is_the_bodys_sha256_within_the_scope() -> None:
    digest = hashlib.sha256("body €".encode()).hexdigest()
    queue_scope = _fifo_message(
        _topic(**{"sqs.ContentBasedDeduplication": "true"}),
        {"MessageGroupId": "g"},
        "body €",
        {"sqs-id": "m"},
        1,
    )
    assert queue_scope["dedup"] == f"q:{digest}" and queue_scope["headers"][DEDUP_HEADER] == digest
    group_scope = _fifo_message(
        _topic(**{"sqs.ContentBasedDeduplication": "true", "sqs.DeduplicationScope": "messageGroup"}),
        {"MessageGroupId": "g:1"},
        "body €",
        {"sqs-id": "m"},
        1,
    )
    assert group_scope["dedup"] == f"g3:g:1:{digest}"  # the group's length first: no two pairs collide


def test_sequence_numbers_are_20_digit_and_grow_with_the_offset() -> None:
    numbers = [sequence_number(o) for o in (0, 1, 9, 10, 2**63)]
    assert all(len(n) >= 20 and n.isdigit() for n in numbers)
    assert [int(n) for n in numbers] == sorted(int(n) for n in numbers)
    assert numbers[:2] == ["00000000000000000000", "00000000000000000001"]


def test_a_fifo_queue_takes_a_redrive_policy_as_a_standard_one_does() -> None:
    policy = '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:d.fifo","maxReceiveCount":3}'
    assert check_attributes({"RedrivePolicy": policy}, 1 << 20, fifo=True) == {"sqs.RedrivePolicy": policy}
    assert check_attributes({"RedrivePolicy": ""}, 1 << 20, fifo=True) == {"sqs.RedrivePolicy": ""}


def test_a_moved_fifo_message_keeps_its_group_and_ids_and_is_deduplicated_by_its_place() -> None:
    m = {
        "queue": 0,
        "offset": 7,
        "key": "alice",
        "value": "body",
        "headers": {ID_HEADER: "id-1", ATTRIBUTES_HEADER: "{}", DEDUP_HEADER: "d-1", SOURCE_HEADER: "s.fifo"},
    }
    headers = moved_headers(m, fifo=True)
    assert headers == {ID_HEADER: "id-1", ATTRIBUTES_HEADER: "{}", DEDUP_HEADER: "d-1"}
    assert moved_headers(m, fifo=False) == {ID_HEADER: "id-1", ATTRIBUTES_HEADER: "{}"}
    moved = moved_fifo(m, 5, headers, 60_000)
    assert moved == {
        "value": "body",
        "key": "alice",
        "headers": headers,
        "ttl_ms": 60_000,
        "dedup": "m:5.0.7",  # its place, never the client's id (scopes q: and g<n>: are the sends')
        "id": "id-1",
    }
    # A binary message produced through the REST API, without a group or ids: its MessageId stands in.
    rest = {"queue": 0, "offset": 3, "key": None, "value_b64": "AAE=", "headers": {}}
    rest_headers = moved_headers(rest, fifo=True)
    assert rest_headers == {ID_HEADER: "0-3", DEDUP_HEADER: "0-3"}
    assert moved_fifo(rest, 9, rest_headers, 1) == {
        "value_b64": "AAE=",
        "headers": rest_headers,
        "ttl_ms": 1,
        "dedup": "m:9.0.3",
        "id": "0-3",
    }
    # Both are messages a dedup_produce entry carries.
    decoded = commands.decode(
        commands.dedup_produce(1_000, 5, 0, [moved, moved_fifo(rest, 9, rest_headers, 1)])
    )
    assert [d.dedup for d in decoded["messages"]] == [b"m:5.0.7", b"m:9.0.3"]


@pytest.mark.parametrize("bad_id", ["", "x" * 256, "é" * 128])
def test_a_moved_message_whose_producer_wrote_a_bad_message_id_moves_under_its_place(bad_id: str) -> None:
    # sqs-id is no reserved header: a REST producer may write one dedup_produce refuses as an id.
    m = {"queue": 2, "offset": 11, "key": "g", "value": "v", "headers": {ID_HEADER: bad_id}}
    headers = moved_headers(m, fifo=True)
    assert headers == {ID_HEADER: "2-11", DEDUP_HEADER: "2-11"}
    assert moved_headers(m, fifo=False) == {ID_HEADER: "2-11"}
    decoded = commands.decode(commands.dedup_produce(1_000, 5, 0, [moved_fifo(m, 5, headers, 1)]))
    assert [(d.message_id, d.dedup) for d in decoded["messages"]] == [("2-11", b"m:5.2.11")]


def test_a_fifo_delay_or_redrive_policy_needs_every_node_of_the_release_that_serves_them() -> None:
    policy = '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:d.fifo","maxReceiveCount":3}'

    def needs(attributes: dict[str, str]) -> bool:
        return needs_fifo_release(check_attributes(attributes, 1 << 20, fifo=True, creating=True))

    assert needs({"DelaySeconds": "1"}) and needs({"DelaySeconds": "900"})
    assert needs({"RedrivePolicy": policy}) and needs({"FifoQueue": "true", "RedrivePolicy": policy})
    # Setting them back, or anything else, is what the release before served too.
    assert not needs({"DelaySeconds": "0"}) and not needs({"DelaySeconds": "00"})
    assert not needs({"RedrivePolicy": ""})
    assert not needs({"FifoQueue": "true", "ContentBasedDeduplication": "true", "VisibilityTimeout": "5"})
    assert FIFO_RELEASE in commands.FIELD_LEVELS
