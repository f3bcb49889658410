"""A rolling upgrade and the SQS API's FIFO settings, with the real boto3 against a real 4-node
cluster in which n4 plays a node of the release before (``faults.previous_release_node``): a FIFO
queue's DelaySeconds and RedrivePolicy are refused (``ServiceUnavailable``, nothing changed) while
any node of the cluster has not advertised ``receive_ordered.delay``, even when no group the queue
uses has that node as a voter (any node serves SQS); once n4 is upgraded they are set."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .harness import Cluster
from .sqs_clients import sqs_client

pytestmark = pytest.mark.timeout(300)

FAULT = '[faults]\nprevious_release_node = "n4"\n'


def _code(call: Any) -> str:
    with pytest.raises(ClientError) as e:
        call()
    code: str = e.value.response["Error"]["Code"]
    return code


def test_fifo_delay_and_redrive_wait_for_every_node_of_the_release(tmp_path: Path) -> None:
    with Cluster(tmp_path, nodes=4, replication=3, queue_groups=1, extra_toml=FAULT) as c:
        c.start()
        c.wait_ready()
        sqs = sqs_client(c.url("n1"))
        assert "receive_ordered.delay" not in c.status("n4").get("capabilities", [])
        assert "0" not in c.status("n4")["groups"]  # no voter of the queues' group: it serves SQS
        fifo = {"FifoQueue": "true"}
        dlq = sqs.create_queue(QueueName="d.fifo", Attributes=fifo)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})

        assert _code(
            lambda: sqs.create_queue(QueueName="s.fifo", Attributes={**fifo, "DelaySeconds": "5"})
        ) == ("ServiceUnavailable")
        assert sqs.list_queues(QueueNamePrefix="s").get("QueueUrls", []) == []  # nothing created
        source = sqs.create_queue(QueueName="s.fifo", Attributes=fifo)["QueueUrl"]
        for attributes in ({"DelaySeconds": "5"}, {"RedrivePolicy": policy}):
            assert _code(lambda a=attributes: sqs.set_queue_attributes(QueueUrl=source, Attributes=a)) == (
                "ServiceUnavailable"
            )
        got = sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["All"])["Attributes"]
        assert got["DelaySeconds"] == "0" and "RedrivePolicy" not in got  # nothing changed
        sqs.set_queue_attributes(QueueUrl=source, Attributes={"DelaySeconds": "0"})  # never refused
        # A standard queue's are what the release before served: not gated.
        standard = sqs.create_queue(QueueName="plain", Attributes={"DelaySeconds": "5"})["QueueUrl"]
        assert standard

        # The upgrade: n4 restarts without the fault, and the settings are taken.
        c.config_path.write_text(c.config_path.read_text().replace('previous_release_node = "n4"', ""))
        c.terminate("n4")
        c.start("n4")
        c.wait_ready()
        deadline = time.monotonic() + 30
        while True:
            try:
                sqs.set_queue_attributes(
                    QueueUrl=source, Attributes={"DelaySeconds": "5", "RedrivePolicy": policy}
                )
                break
            except ClientError as e:
                assert e.response["Error"]["Code"] == "ServiceUnavailable"
                assert time.monotonic() < deadline, "the FIFO settings still refused after the upgrade"
                time.sleep(0.5)
        got = sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["All"])["Attributes"]
        assert got["DelaySeconds"] == "5" and json.loads(got["RedrivePolicy"])["maxReceiveCount"] == 2
