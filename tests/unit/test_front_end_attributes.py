"""The REST API cannot set or remove the attributes the SQS API owns (``sqs.*``): the SQS API
stores them only after its own checks (a RedrivePolicy's target and the caller's rights on it,
the values its actions parse), so ``PATCH /v1/topics/{topic}`` and ``POST /v1/topics`` refuse
them (400 ``bad_request``); other attributes pass as before. A value stored that way before is
read as no policy (a RedriveAllowPolicy: as allowing no source), not an error of every action.
The same hole through real nodes and boto3: ``tests/integration/test_sqs_auth.py``."""

from __future__ import annotations

from typing import Any

import pytest

from raftmq.cluster.api.sqs.queues import RedrivePolicy, allows_redrive_from, redrive_policy
from raftmq.cluster.api.validation import parse_create_topic, parse_create_topics, parse_topic_patch
from raftmq.cluster.base.errors import ApiError
from raftmq.cluster.config.cluster_file import Limits
from raftmq.cluster.machines.metadata import Topic

POLICY = '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:payments","maxReceiveCount":1}'


def _refused(call: Any) -> str:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.error.code == "bad_request"
    return e.value.message


@pytest.mark.parametrize(
    "attributes",
    [
        {"sqs.RedrivePolicy": POLICY},
        {"sqs.CreatedTimestamp": None},
        {"SQS.FifoQueue": "true"},
        {"sqs.x": "1"},
    ],
)
def test_a_patch_may_not_set_or_remove_the_sqs_apis_attributes(attributes: dict[str, Any]) -> None:
    assert "SQS API" in _refused(lambda: parse_topic_patch({"attributes": {"team": "a", **attributes}}))


def test_a_new_topic_may_not_carry_the_sqs_apis_attributes() -> None:
    limits = Limits()
    spec = {"name": "t", "attributes": {"sqs.CreatedTimestamp": "1"}}
    _refused(lambda: parse_create_topic(spec, limits))
    _refused(lambda: parse_create_topics({"topics": [{"name": "u"}, spec]}, limits))


def test_other_attributes_still_pass() -> None:
    assert parse_topic_patch({"attributes": {"sqsx": "1", "team.sqs.x": "2", "gone": None}}) == {
        "op": "set_topic_attributes",
        "attributes": {"sqsx": "1", "team.sqs.x": "2", "gone": None},
    }
    assert parse_create_topic({"name": "t", "attributes": {"owner": "a"}}, Limits())["attributes"] == {
        "owner": "a"
    }


def _queue(**attributes: str) -> Topic:
    fields = {"name": "q", "id": 7, "queues": 1, "queue_groups": [0], "retention_ms": None}
    fields |= {"retention_bytes": None, "max_message_bytes": None, "created_ms": 1}
    return Topic.from_json({**fields, "attributes": {"sqs.CreatedTimestamp": "1", **attributes}})


@pytest.mark.parametrize(
    "stored", ["not json", "[]", "5", "null", '{"maxReceiveCount": 1}', '{"deadLetterTargetArn": 5}']
)
def test_a_policy_stored_unchecked_before_is_none_and_allows_no_source(stored: str) -> None:
    """Before, json.loads raised: every ReceiveMessage of the queue, and every StartMessageMoveTask
    of the cluster (it reads every queue's policy), answered InternalError."""
    assert redrive_policy(_queue(**{"sqs.RedrivePolicy": stored})) is None
    assert not allows_redrive_from(_queue(**{"sqs.RedriveAllowPolicy": stored}), "arn:aws:sqs:r:0:q")
    assert redrive_policy(_queue(**{"sqs.RedrivePolicy": POLICY})) == RedrivePolicy("payments", 1)


@pytest.mark.parametrize(
    "sources",
    ['"arn:aws:sqs:r:0:q-and-more"', '{"arn:aws:sqs:r:0:q": 1}', "5", '["x", ["arn:aws:sqs:r:0:q"]]'],
)
def test_a_stored_allow_policy_lets_only_the_sources_of_its_list(sources: str) -> None:
    """A text holding the ARN matched as a part of it (``in`` a string): that source was let in."""
    stored = f'{{"redrivePermission": "byQueue", "sourceQueueArns": {sources}}}'
    assert not allows_redrive_from(_queue(**{"sqs.RedriveAllowPolicy": stored}), "arn:aws:sqs:r:0:q")
    listed = '{"redrivePermission": "byQueue", "sourceQueueArns": ["arn:aws:sqs:r:0:q"]}'
    assert allows_redrive_from(_queue(**{"sqs.RedriveAllowPolicy": listed}), "arn:aws:sqs:r:0:q")
    assert allows_redrive_from(_queue(**{"sqs.RedriveAllowPolicy": '{"redrivePermission": "allowAll"}'}), "a")
