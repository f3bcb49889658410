"""The SQS workload: real boto3 clients send, receive and delete through the Amazon SQS API.

- ``setup`` creates the SQS queue (``CreateQueue``, through the nodes in turn until one answers).
- Sender ``w`` talks to node ``w mod N``: SendMessageBatch of ``batch`` bodies ``"sqs<w>-<seq>"``
  (each sent once in the run), paced so that the senders together offer ``rate`` messages a second.
- Receiver ``w`` talks to node ``w mod N``: ReceiveMessage (up to 10, a long poll of
  ``wait_s``, visibility ``visibility_s``), then DeleteMessageBatch of every receipt it got, at once,
  on the same node.
- ``drain`` (after the heal): receive and delete through the nodes in turn until a receive finds
  nothing and the queue's attributes say it holds nothing (visible, in flight or delayed).

Every call is one attempt at one node: boto3's retries are off (``total_max_attempts`` 1), so the
history shows each attempt and its node, and an outcome is as honest as the chaos client's
(``client``): ``fail`` for an SQS error after which nothing was done (``sqs_checker.SQS_DEFINITE``),
a connection never opened or a stopped node; ``info`` for ``InternalError``, a timeout or a
connection lost after the request went out. boto3 keeps its connections (as applications run it);
a restarted node has a new port, so a new client. The history's operations are described in
``sqs_checker``. The workers are threads (boto3 blocks); the history is safe to append to from them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from .client import NodeDown
from .history import INVOKE, History
from .sqs_checker import SQS_DEFINITE

__all__ = ["SqsConfig", "SqsWorkload"]


@dataclass(frozen=True)
class SqsConfig:
    queue: str = "chaos-sqs"
    senders: int = 3
    receivers: int = 3
    rate: float = 200.0  # messages a second offered, all senders together
    batch: int = 10  # messages per SendMessageBatch (SQS's most)
    wait_s: int = 1  # ReceiveMessage's WaitTimeSeconds
    visibility_s: int = 5
    drain_visibility_s: int = 10
    client_timeout_s: float = 3.0  # beyond a long poll's wait
    drain_timeout_s: float = 90.0


@dataclass
class Call:
    type: str  # ok | fail | info
    body: dict[str, Any]
    error: str | None = None
    detail: str | None = None


class SqsWorkload:
    def __init__(
        self, url: Callable[[str], str], history: History, nodes: list[str], config: SqsConfig
    ) -> None:
        self.url = url  # node -> its HTTP base URL from here (raises NodeDown when stopped)
        self.history = history
        self.nodes = nodes
        self.config = config
        self.queue_url = ""
        self.sent = 0  # bodies acknowledged
        self._lock = threading.Lock()

    # -- boto3 -------------------------------------------------------------------------------------

    def _clients(self) -> Callable[[str], Any]:
        """A worker's clients, one per node and port (a restarted node is on a new port)."""
        session = boto3.session.Session()  # a session is not shared between threads
        timeout = self.config.client_timeout_s
        config = botocore.config.Config(
            retries={"total_max_attempts": 1},
            connect_timeout=timeout,
            read_timeout=timeout + self.config.wait_s,
            max_pool_connections=2,
        )
        cache: dict[str, Any] = {}

        def client(node: str) -> Any:
            url = self.url(node)
            if url not in cache:
                cache[url] = session.client(
                    "sqs", endpoint_url=url, region_name="us-east-1", aws_access_key_id="chaos",
                    aws_secret_access_key="chaos", config=config,
                )  # fmt: skip
            return cache[url]

        return client

    def _call(self, client: Callable[[str], Any], node: str, action: str, **params: Any) -> Call:
        try:
            return Call("ok", getattr(client(node), action)(**params))
        except NodeDown:
            return Call("fail", {}, "node_down")
        except botocore.exceptions.ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", "unknown"))
            return Call("fail" if code in SQS_DEFINITE else "info", {}, code)
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError) as e:
            return Call("fail", {}, "connect_failed", str(e)[-160:])  # nothing was sent
        except botocore.exceptions.ReadTimeoutError as e:
            return Call("info", {}, "client_timeout", str(e)[-160:])
        except (botocore.exceptions.BotoCoreError, OSError) as e:
            return Call("info", {}, "connection_lost", f"{type(e).__name__}: {e}"[-160:])

    def _record(self, common: dict[str, Any], call: Call, **ok: Any) -> None:
        if call.type == "ok":
            self.history.append(type="ok", **common, **ok)
        else:
            detail = {"detail": call.detail} if call.detail else {}
            self.history.append(type=call.type, error=call.error, **common, **detail)

    # -- operations --------------------------------------------------------------------------------

    def setup(self, timeout_s: float = 60.0) -> None:
        """Create the queue, through the nodes in turn until one answers."""
        client = self._clients()
        deadline = time.monotonic() + timeout_s
        attributes = {"VisibilityTimeout": str(self.config.visibility_s)}
        for attempt in range(10_000):
            call = self._call(client, self.nodes[attempt % len(self.nodes)], "create_queue",
                              QueueName=self.config.queue, Attributes=attributes)  # fmt: skip
            if call.type == "ok":
                self.queue_url = call.body["QueueUrl"]
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not create SQS queue {self.config.queue}: {call.error}")
            time.sleep(0.5)

    def send(self, client: Callable[[str], Any], process: int, node: str, values: list[str]) -> Call:
        common = {"process": process, "f": "sqs-send", "node": node, "values": values}
        self.history.append(type=INVOKE, **common)
        entries = [{"Id": str(i), "MessageBody": v} for i, v in enumerate(values)]
        call = self._call(client, node, "send_message_batch", QueueUrl=self.queue_url, Entries=entries)
        results: list[str] = []
        if call.type == "ok":
            outcome = {str(s["Id"]): "ok" for s in call.body.get("Successful", [])}
            outcome |= {str(f["Id"]): str(f.get("Code", "unknown")) for f in call.body.get("Failed", [])}
            results = [outcome.get(str(i), "missing") for i in range(len(values))]
            with self._lock:
                self.sent += results.count("ok")
        self._record(common, call, results=results)
        return call

    def receive(
        self, client: Callable[[str], Any], f: str, process: int, node: str, visibility_s: int
    ) -> tuple[Call, list[list[Any]]]:
        common = {"process": process, "f": f, "node": node}
        self.history.append(type=INVOKE, **common)
        call = self._call(
            client, node, "receive_message", QueueUrl=self.queue_url, MaxNumberOfMessages=10,
            WaitTimeSeconds=self.config.wait_s, VisibilityTimeout=visibility_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )  # fmt: skip
        got = [
            [m["Body"], m["MessageId"], int(m.get("Attributes", {}).get("ApproximateReceiveCount", 0)),
             m["ReceiptHandle"]]
            for m in call.body.get("Messages", [])
        ]  # fmt: skip
        self._record(common, call, messages=got)
        return call, got

    def delete(
        self, client: Callable[[str], Any], f: str, process: int, node: str, got: list[list[Any]]
    ) -> Call:
        messages = [[body, receipt] for body, _, _, receipt in got]
        common = {"process": process, "f": f, "node": node, "messages": messages}
        self.history.append(type=INVOKE, **common)
        entries = [{"Id": str(i), "ReceiptHandle": receipt} for i, (_, receipt) in enumerate(messages)]
        call = self._call(client, node, "delete_message_batch", QueueUrl=self.queue_url, Entries=entries)
        results: list[str] = []
        if call.type == "ok":
            outcome = {str(s["Id"]): "ok" for s in call.body.get("Successful", [])}
            outcome |= {str(f["Id"]): str(f.get("Code", "unknown")) for f in call.body.get("Failed", [])}
            results = [outcome.get(str(i), "missing") for i in range(len(messages))]
        self._record(common, call, results=results)
        return call

    # -- workers (threads) -------------------------------------------------------------------------

    def sender(self, w: int, stop: threading.Event) -> None:
        node = self.nodes[w % len(self.nodes)]
        client = self._clients()
        process = self.history.new_process()
        interval = self.config.senders * self.config.batch / self.config.rate
        next_at = time.monotonic() + interval * w / max(1, self.config.senders)
        seq = 0
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = max(next_at + interval, time.monotonic())
            values = [f"sqs{w}-{seq + i}" for i in range(self.config.batch)]
            seq += self.config.batch
            if self.send(client, process, node, values).type == "info":
                process = self.history.new_process()

    def receiver(self, w: int, stop: threading.Event) -> None:
        node = self.nodes[w % len(self.nodes)]
        client = self._clients()
        process = self.history.new_process()
        while not stop.is_set():
            call, got = self.receive(client, "sqs-receive", process, node, self.config.visibility_s)
            if call.type == "info":
                process = self.history.new_process()
            if got and self.delete(client, "sqs-delete", process, node, got).type == "info":
                process = self.history.new_process()
            if call.type != "ok":
                stop.wait(0.1)  # do not spin against a node that is down

    # -- the end -------------------------------------------------------------------------------------

    def drain(self) -> dict[str, Any]:
        """Receive and delete through the nodes in turn until a receive finds nothing and the queue
        holds nothing (``drain_timeout_s`` at most)."""
        client = self._clients()
        deadline = time.monotonic() + self.config.drain_timeout_s
        process = self.history.new_process()
        rounds = errors = received = 0
        left: dict[str, str] | None = None
        while time.monotonic() < deadline:
            node = self.nodes[rounds % len(self.nodes)]
            rounds += 1
            visibility_s = self.config.drain_visibility_s
            call, got = self.receive(client, "sqs-drain-receive", process, node, visibility_s)
            if call.type == "info":
                process = self.history.new_process()
            if call.type != "ok":
                errors += 1
                time.sleep(0.2)
                continue
            received += len(got)
            if got:
                if self.delete(client, "sqs-drain-delete", process, node, got).type == "info":
                    process = self.history.new_process()
                continue
            left = self._left(client, node)
            if left is not None and not any(int(n) for n in left.values()):
                return {"complete": True, "rounds": rounds, "errors": errors, "received": received}
        return {"complete": False, "rounds": rounds, "errors": errors, "received": received, "left": left}

    def _left(self, client: Callable[[str], Any], node: str) -> dict[str, str] | None:
        """The queue's counts of messages visible, in flight and delayed (None: no answer)."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed"]  # fmt: skip
        call = self._call(client, node, "get_queue_attributes", QueueUrl=self.queue_url, AttributeNames=names)
        if call.type != "ok":
            return None
        attributes: dict[str, str] = call.body.get("Attributes", {})
        return attributes
