"""Real SQS clients for the tests: boto3 on its default JSON protocol, and botocore forced to the
query (XML) protocol by a copy of its own SQS model with the query protocol's member names."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import botocore
import botocore.session
from botocore.config import Config

XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
# Flattened list and map members and the element names AWS's query protocol gives them.
_QUERY_NAMES = {
    "Attributes": "Attribute",
    "MessageAttributes": "MessageAttribute",
    "AttributeNames": "AttributeName",
    "MessageAttributeNames": "MessageAttributeName",
    "MessageSystemAttributeNames": "MessageSystemAttributeName",
    "Messages": "Message",
    "QueueUrls": "QueueUrl",
    "Failed": "BatchResultErrorEntry",
    "tags": "Tag",  # CreateQueue's Tag.N.Key / Tag.N.Value
    "Tags": "Tag",  # TagQueue's, and ListQueueTags' <Tag><Key/><Value/></Tag>
    "TagKeys": "TagKey",
    "AWSAccountIds": "AWSAccountId",
    "Actions": "ActionName",
    "Results": "ListMessageMoveTasksResultEntry",
}


ANY_KEY = ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")


def sqs_client(
    url: str, credentials: tuple[str, str] = ANY_KEY, region: str = "eu-west-1", **config: Any
) -> Any:
    """A boto3 SQS client against ``url``; by default with credentials a cluster without tokens
    takes (any), else ``credentials`` (access key id, secret access key)."""
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=credentials[0],
        aws_secret_access_key=credentials[1],
        config=Config(**config),
    )


def _query_model() -> dict[str, Any]:
    path = Path(botocore.__file__).parent / "data" / "sqs" / "2012-11-05" / "service-2.json.gz"
    model: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    model["metadata"].update(protocol="query", protocols=["query"], xmlNamespace=XMLNS)
    model["metadata"].pop("awsQueryCompatible", None)
    model["metadata"].pop("jsonVersion", None)
    model["metadata"].pop("targetPrefix", None)
    for shape in model["shapes"].values():
        if shape["type"] == "map" and shape.get("flattened"):
            shape["key"]["locationName"] = "Key" if "Tag" in shape["key"]["shape"] else "Name"
            shape["value"]["locationName"] = "Value"
        for name, member in shape.get("members", {}).items():
            if name in _QUERY_NAMES:
                member["locationName"] = _QUERY_NAMES[name]
    for name, op in model["operations"].items():
        if "output" in op:
            op["output"]["resultWrapper"] = f"{name}Result"
        if name.endswith("Batch") and "output" in op:  # <SendMessageBatchResultEntry> ...
            result = model["shapes"][op["output"]["shape"]]
            result["members"]["Successful"]["locationName"] = f"{name}ResultEntry"
            entries = model["shapes"][op["input"]["shape"]]["members"]["Entries"]
            entries["locationName"] = f"{name}RequestEntry"
    return model


def query_sqs_client(
    url: str, tmp: Path, credentials: tuple[str, str] = ANY_KEY, region: str = "eu-west-1", **config: Any
) -> Any:
    """A botocore SQS client that speaks the query protocol (form posts, XML answers); ``config``
    as :func:`sqs_client`'s."""
    folder = tmp / "models" / "sqs" / "2012-11-05"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "service-2.json").write_text(json.dumps(_query_model()))
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(tmp / "models"))
    return session.create_client(
        "sqs",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=credentials[0],
        aws_secret_access_key=credentials[1],
        config=Config(**config),
    )


def until(what: str, check: Callable[[], Any], timeout_s: float = 60) -> Any:
    """``check()``'s first truthy answer, asked every 0.3 s; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.3)
