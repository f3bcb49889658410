"""The AWS CLI (PyPI ``awscli``, the test extra) against a real 3-node cluster, unchanged but for
``--endpoint-url``: the walk-through of docs/sqs.md (create-queue, send-message, receive-message,
delete-message), and an AWS CLI error that is AWS's."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .harness import Cluster

AWS = str(Path(sys.executable).parent / "aws")


def _aws(cluster: Cluster, *args: str, node: str = "n1", check: bool = True) -> Any:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "any",  # a cluster without tokens takes any credentials
        "AWS_SECRET_ACCESS_KEY": "any",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    done = subprocess.run(
        [AWS, "sqs", *args, "--endpoint-url", cluster.url(node), "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if not check:
        return done
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_the_aws_cli_creates_sends_receives_and_deletes(cluster: Cluster) -> None:
    url = _aws(cluster, "create-queue", "--queue-name", "cli-orders")["QueueUrl"]
    assert url == f"{cluster.url('n1')}/000000000000/cli-orders"
    sent = _aws(cluster, "send-message", "--queue-url", url, "--message-body", '{"order": 7}', node="n2")
    assert sent["MD5OfMessageBody"] == hashlib.md5(b'{"order": 7}').hexdigest()
    got = _aws(cluster, "receive-message", "--queue-url", url, "--wait-time-seconds", "10", node="n3")
    (message,) = got["Messages"]
    assert message["Body"] == '{"order": 7}' and message["MessageId"] == sent["MessageId"]
    _aws(cluster, "delete-message", "--queue-url", url, "--receipt-handle", message["ReceiptHandle"])
    attributes = _aws(
        cluster,
        "get-queue-attributes",
        "--queue-url",
        url,
        "--attribute-names",
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
    )["Attributes"]
    assert attributes == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
    assert _aws(cluster, "receive-message", "--queue-url", url, "--wait-time-seconds", "1") is None
    missing = _aws(cluster, "get-queue-url", "--queue-name", "cli-none", check=False)
    assert missing.returncode != 0 and "AWS.SimpleQueueService.NonExistentQueue" in missing.stderr
