"""The raftmq Python client: producer, consumer, subscriber and admin, in sync and asyncio flavours.

Example::

    from raftmq.client import Producer, Consumer

    with Producer(["127.0.0.1:7001", "127.0.0.1:7002"]) as producer:
        meta = producer.send("orders", "hello", key="customer-7").result()  # RecordMetadata

    with Consumer(["127.0.0.1:7001"], group="billing", topics="orders") as consumer:
        for msg in consumer:
            handle(msg.value)
            msg.ack()

Every error is a :class:`~raftmq.client.errors.RaftmqError` (:mod:`raftmq.client.errors` draws the
tree). docs/client.md is the guide.
"""

from ._admin import UNCHANGED, AsyncAdmin, Unchanged
from ._consumer import AsyncConsumer, Mode, Reset, TopicQueue
from ._metadata import key_queue
from ._outcome import DeliveryCallback, FutureRecord
from ._producer import AsyncProducer
from ._received import ReceivedMessage
from ._subscriber import AsyncSubscriber, Subscriber
from ._subscriber_config import SubscribeMode, SubscriberOptions, SubscriberStats
from ._sync import Admin, Consumer, Producer
from ._types import (
    ClusterStatus,
    GroupStatus,
    Message,
    NodeInfo,
    QueueState,
    RecordMetadata,
    ReplicaStatus,
    SubscriptionSettings,
    TopicDescription,
    TopicInfo,
)
from .errors import (
    BadBatch,
    BadRequest,
    BufferFull,
    ChangeInProgress,
    ClientClosed,
    ConnectionFailed,
    ConnectionLost,
    DeadLetterTopicConflict,
    DedupWindowFull,
    DeliveryTimeout,
    Forbidden,
    InternalError,
    InvalidJson,
    LockHeld,
    MemberNotOwned,
    MessageTooLarge,
    MethodNotAllowed,
    NoChangeInProgress,
    NotFound,
    NotLeader,
    OffsetOutOfRange,
    QueueNotFound,
    RaftmqError,
    RequestTimeout,
    RequestTooLarge,
    ReservedHeader,
    StaleEpoch,
    StaleReceipt,
    StaleSequence,
    Timeout,
    TooManyGroups,
    TooManyMembers,
    TooManyRequests,
    TopicExists,
    TopicNotFound,
    Unauthorized,
    Unavailable,
    UnexpectedResponse,
    UnknownOutcome,
    UpgradeInProgress,
)

__all__ = [
    "UNCHANGED",
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncSubscriber",
    "BadBatch",
    "BadRequest",
    "BufferFull",
    "ChangeInProgress",
    "ClientClosed",
    "ClusterStatus",
    "ConnectionFailed",
    "ConnectionLost",
    "Consumer",
    "DeadLetterTopicConflict",
    "DedupWindowFull",
    "DeliveryCallback",
    "DeliveryTimeout",
    "Forbidden",
    "FutureRecord",
    "GroupStatus",
    "InternalError",
    "InvalidJson",
    "LockHeld",
    "MemberNotOwned",
    "Message",
    "MessageTooLarge",
    "MethodNotAllowed",
    "Mode",
    "NoChangeInProgress",
    "NodeInfo",
    "NotFound",
    "NotLeader",
    "OffsetOutOfRange",
    "Producer",
    "QueueNotFound",
    "QueueState",
    "RaftmqError",
    "ReceivedMessage",
    "RecordMetadata",
    "ReplicaStatus",
    "RequestTimeout",
    "RequestTooLarge",
    "ReservedHeader",
    "Reset",
    "StaleEpoch",
    "StaleReceipt",
    "StaleSequence",
    "SubscribeMode",
    "Subscriber",
    "SubscriberOptions",
    "SubscriberStats",
    "SubscriptionSettings",
    "Timeout",
    "TooManyGroups",
    "TooManyMembers",
    "TooManyRequests",
    "TopicDescription",
    "TopicExists",
    "TopicInfo",
    "TopicNotFound",
    "TopicQueue",
    "Unauthorized",
    "Unavailable",
    "Unchanged",
    "UnexpectedResponse",
    "UnknownOutcome",
    "UpgradeInProgress",
    "key_queue",
]
