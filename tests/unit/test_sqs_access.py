"""The SQS API's permission table (``cluster/api/sqs/access.py``): deny by default, and a request
posted to a queue's URL acts on that queue only. Pure functions: no node, no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftmq.cluster.api.sqs.access import RIGHTS, authorize, bind_path_queue, queue_name_of
from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.config.tokens import TokenGrant, token_digest

ADMIN = TokenGrant(name="admin", digest=token_digest("x" * 20), admin=("*",), produce=("*",), consume=("*",))
URL = "http://127.0.0.1:8081/000000000000/orders"


async def _names(name: str, creating: bool) -> list[str]:
    return [name]


def _authorize(action: str, params: dict[str, Any], grant: TokenGrant = ADMIN) -> None:
    asyncio.run(authorize(action, params, grant, _names))


def _code(call: Any) -> str:
    with pytest.raises(SqsError) as e:
        call()
    return e.value.aws.code


def test_an_action_missing_from_the_table_is_refused_even_for_an_admin_of_every_queue() -> None:
    for action in ("NoSuchAction", "", "createqueue", "__class__", "CreateQueue "):
        assert action not in RIGHTS
        assert _code(lambda action=action: _authorize(action, {"QueueUrl": URL})) == "InvalidAction"
    _authorize("TagQueue", {"QueueUrl": URL})  # one in the table: an admin passes


def test_tagging_needs_admin_and_listing_tags_any_right() -> None:
    producer = TokenGrant(name="p", digest=token_digest("p" * 20), produce=("orders",))
    consumer = TokenGrant(name="c", digest=token_digest("c" * 20), consume=("orders",))
    for grant in (producer, consumer):
        for action in ("TagQueue", "UntagQueue", "AddPermission", "RemovePermission"):
            assert _code(lambda a=action, g=grant: _authorize(a, {"QueueUrl": URL}, g)) == "AccessDenied"
        _authorize("ListQueueTags", {"QueueUrl": URL}, grant)
        assert _code(lambda g=grant: _authorize("CreateQueue", {"QueueName": "orders", "tags": {}}, g)) == (
            "AccessDenied"
        )


def test_a_request_posted_to_a_queue_url_names_no_other_queue() -> None:
    params: dict[str, Any] = {}
    bind_path_queue("SendMessage", params, URL, "orders")
    assert params == {"QueueUrl": URL}  # the path's queue when the form names none
    same = {"QueueUrl": "http://elsewhere:1/123456789012/orders"}  # another node's URL of it
    bind_path_queue("SendMessage", same, URL, "orders")
    assert same == {"QueueUrl": "http://elsewhere:1/123456789012/orders"}
    for action, params in (
        ("SendMessage", {"QueueUrl": URL.replace("orders", "payments")}),
        ("TagQueue", {"QueueUrl": "payments"}),
        ("GetQueueUrl", {"QueueName": "payments"}),
        ("CreateQueue", {"QueueName": "payments"}),
        ("StartMessageMoveTask", {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:payments"}),
        ("ListMessageMoveTasks", {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:payments"}),
        ("CancelMessageMoveTask", {"TaskHandle": "payments:3"}),
    ):
        assert _code(lambda a=action, p=params: bind_path_queue(a, p, URL, "orders")) == "InvalidAddress"
    assert _code(lambda: bind_path_queue("NoSuchAction", {}, URL, "orders")) == "InvalidAction"
    own = {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:orders"}  # the path's queue: fine
    bind_path_queue("StartMessageMoveTask", own, URL, "orders")
    assert own == {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:orders"}
    listed: dict[str, Any] = {"QueueNamePrefix": "x"}
    bind_path_queue("ListQueues", listed, URL, "orders")  # names no queue: left alone
    assert listed == {"QueueNamePrefix": "x"}


def test_the_queue_a_url_names_is_its_last_path_segment_whatever_its_host() -> None:
    assert queue_name_of("http://a:1/000000000000/q", "QueueUrl") == "q"
    assert queue_name_of("http://a:1/000000000000/q/", "QueueUrl") == "q"
    assert queue_name_of("http://a:1/000000000000/q?x=/b#/c", "QueueUrl") == "q"
    assert queue_name_of("http://a:1/", "QueueUrl") is None
    assert queue_name_of(5, "QueueUrl") is None
    assert queue_name_of("http://[::1/000000000000/q", "QueueUrl") is None  # urlsplit raised: a 500
    assert queue_name_of("http://a:99999999999/000000000000/q", "QueueUrl") == "q"
