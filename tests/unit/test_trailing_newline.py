"""A name or id with a trailing newline is refused. Python's ``$`` matches before a final newline,
so the patterns ``^...$`` let ``"orders\\n"`` through: a topic or SQS queue of that name was
created (its URL and log lines carrying the newline, a receive on it refused). The API's patterns
end in ``\\Z`` now, and a topic's name is checked for it at the API (the metadata machine's
pattern is left as it is: replicas of the release before must apply the same commands)."""

from __future__ import annotations

import re

import pytest

from raftmq.cluster.api.handlers.subscription_bodies import receipt_numbers
from raftmq.cluster.api.sqs import message_actions, messages, move_task_records, queues, sigv4
from raftmq.cluster.api.validation import parse_create_topic, parse_topic_patch
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.config.cluster_file import Limits

GOOD = [
    (queues.QUEUE_NAME, "orders.fifo"),
    (messages._NAME, "trace.id"),
    (messages._DATA_TYPE, "Number.int"),
    (message_actions._FIFO_ID, "group-1"),
    (message_actions._ENTRY_ID, "entry_1"),
    (move_task_records._TASK_ID, "0" * 32),
    (sigv4._SIGNATURE, "a" * 64),
    (sigv4._HEADER_NAME, "x-amz-date"),
    (sigv4._CREDENTIAL, "admin/20261130/us-east-1/sqs/aws4_request"),
]


@pytest.mark.parametrize(("pattern", "good"), GOOD)
def test_the_sqs_apis_patterns_refuse_a_trailing_newline(pattern: re.Pattern[str], good: str) -> None:
    assert pattern.match(good)
    assert not pattern.match(good + "\n")


def test_a_receipt_handle_with_a_trailing_newline_is_refused() -> None:
    assert receipt_numbers("1.2.3.4") == (1, 2, 3, 4)
    assert receipt_numbers("1.2.3.4\n") is None


def test_a_topic_name_with_a_trailing_newline_is_refused() -> None:
    assert parse_create_topic({"name": "orders"}, Limits())["name"] == "orders"
    with pytest.raises(ApiError) as e:
        parse_create_topic({"name": "orders\n"}, Limits())
    assert e.value.error.code == "bad_request"


def test_an_attribute_name_with_a_trailing_newline_is_refused() -> None:
    assert parse_topic_patch({"attributes": {"team": "a"}})["attributes"] == {"team": "a"}
    for call in (
        lambda: parse_topic_patch({"attributes": {"team\n": "a"}}),
        lambda: parse_create_topic({"name": "t", "attributes": {"team\n": "a"}}, Limits()),
    ):
        with pytest.raises(ApiError) as e:
            call()
        assert e.value.error.code == "bad_request"
