"""The shapes of queue-group commands (``cluster/commands/__init__.py``): the limits (from
``base/limits.py``), :class:`BadCommand` (from ``base/errors.py``) and the decoded commands as
TypedDicts. Import them from ``cluster.commands``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, NotRequired, TypedDict

from raftmq.cluster.base.errors import BadCommand as BadCommand
from raftmq.cluster.base.limits import (
    MAX_BACKOFF_LEVELS as MAX_BACKOFF_LEVELS,
)
from raftmq.cluster.base.limits import (
    MAX_DURATION_MS as MAX_DURATION_MS,
)
from raftmq.cluster.base.limits import (
    MAX_NAME_BYTES as MAX_NAME_BYTES,
)
from raftmq.cluster.base.limits import (
    MAX_RECEIPTS as MAX_RECEIPTS,
)
from raftmq.cluster.base.limits import (
    MAX_RECEIVE as MAX_RECEIVE,
)
from raftmq.cluster.base.limits import (
    MAX_TICK_ITEMS as MAX_TICK_ITEMS,
)
from raftmq.cluster.base.limits import (
    MAX_TIME_MS as MAX_TIME_MS,
)
from raftmq.cluster.commands.append import AppendCommand
from raftmq.cluster.commands.producers import ExpireProducersCommand
from raftmq.cluster.commands.segments import SealSegmentCommand
from raftmq.storage.records import NewMessage

VERSION = 1


class ProduceBatch(TypedDict):
    """A decoded produce batch; messages are normalized to :class:`NewMessage` (with
    ``expires_at_ms`` = (``deliver_at_ms`` or ``now_ms``) + ``ttl_ms``). ``deliver_at_ms`` is None
    when no message of the batch is delayed, else one entry per message (None: not delayed)."""

    topic_id: int
    queue: int
    producer_id: str | None
    sequence: int | None
    messages: list[NewMessage]
    deliver_at_ms: list[int | None] | None


class DedupMessage(NamedTuple):
    """A message of ``dedup_produce`` (``cluster/commands/dedup.py``)."""

    message: NewMessage
    dedup: bytes  # the deduplication key, opaque to the state machine
    message_id: str  # what a duplicate of it is answered with


class DedupProduceCommand(TypedDict):
    v: int
    op: Literal["dedup_produce"]
    now_ms: int
    topic_id: int
    queue: int
    messages: list[DedupMessage]


class ProduceCommand(TypedDict):
    v: int
    op: Literal["produce"]
    now_ms: int
    batches: list[ProduceBatch]


class CommitOffsetsCommand(TypedDict):
    v: int
    op: Literal["commit_offsets"]
    group: str
    topic_id: int
    offsets: dict[int, int]
    advance: bool  # only offsets moving forward apply (absent in entries before the field: False)


class RetainQueue(TypedDict):
    topic_id: int
    queue: int
    max_age_ms: int | None
    max_bytes: int | None


class RetainCommand(TypedDict):
    v: int
    op: Literal["retain"]
    now_ms: int
    queues: list[RetainQueue]
    max_jump_ms: int | None  # None: age-based removal trusts now_ms (entries written before the bound)
    max_batches: int | None  # None: no bound on the batches removed (entries written before the bound)


class DropTopicCommand(TypedDict):
    v: int
    op: Literal["drop_topic"]
    topic_id: int


class NoopCommand(TypedDict):
    v: int
    op: Literal["noop"]


class SubscribeCommand(TypedDict):
    v: int
    op: Literal["subscribe"]
    group: str
    topic_id: int
    topic: str
    dlq_topic_id: int | None
    max_deliveries: int
    backoff_ms: list[int]
    overwrite: bool
    checked: bool
    configured: bool
    now_ms: int | None
    creator: str | None
    max_topic_groups: int | None
    max_token_groups: int | None


class ExpireSubscriptionsCommand(TypedDict):
    v: int
    op: Literal["expire_subscriptions"]
    now_ms: int
    idle_ms: int
    max: int
    offset_retention_ms: int | None  # None: the offset API's offsets stay (entries before the field)


class TouchSubscriptionsCommand(TypedDict):
    v: int
    op: Literal["touch_subscriptions"]
    now_ms: int
    groups: list[tuple[int, str]]  # (topic_id, group), each once


class ReceiveCommand(TypedDict):
    v: int
    op: Literal["receive", "receive_ordered"]
    now_ms: int
    group: str
    topic_id: int
    queues: list[int]
    max: int
    visibility_ms: int
    epoch: int | None
    max_age_ms: int | None
    delay_ms: NotRequired[int | None]  # receive_ordered only: a message's first hand-out after it


class Receipt(NamedTuple):
    queue: int
    offset: int
    token: int


class ReceiptsCommand(TypedDict):
    """``ack``, ``nack``, ``extend`` and ``release``; ``delay_ms`` is only set for nack,
    ``visibility_ms`` only for extend (0 otherwise)."""

    v: int
    op: Literal["ack", "nack", "extend", "release"]
    now_ms: int
    group: str
    topic_id: int
    receipts: list[Receipt]
    epoch: int | None
    delay_ms: int | None
    visibility_ms: int


class AckReceiveCommand(TypedDict):
    """``ack_receive``: the ``ack`` of ``receipts``, then a ``receive`` (no epoch) in the same
    entry; ``visibility_ms`` is the receive's."""

    v: int
    op: Literal["ack_receive"]
    now_ms: int
    group: str
    topic_id: int
    receipts: list[Receipt]
    queues: list[int]
    max: int
    visibility_ms: int
    max_age_ms: int | None


class DeliverTickCommand(TypedDict):
    v: int
    op: Literal["deliver_tick"]
    now_ms: int
    max: int
    expiry_backoff: bool  # an expired delivery waits its backoff first (absent on the wire: true)


class LockCommand(TypedDict):
    v: int
    op: Literal["lock"]
    now_ms: int
    group: str
    topic_id: int
    queue: int
    consumer: str
    lease_ms: int


class UnlockCommand(TypedDict):
    v: int
    op: Literal["unlock"]
    group: str
    topic_id: int
    queue: int
    consumer: str
    epoch: int


class CommitFencedCommand(TypedDict):
    v: int
    op: Literal["commit_fenced"]
    group: str
    topic_id: int
    offsets: dict[int, int]
    epoch: int
    advance: bool


class RedriveCommand(TypedDict):
    v: int
    op: Literal["redrive"]
    now_ms: int
    group: str
    topic_id: int
    dlq_topic_id: int
    queues: list[int]
    max: int


Command = (
    AppendCommand
    | DedupProduceCommand
    | ProduceCommand
    | CommitOffsetsCommand
    | RetainCommand
    | DropTopicCommand
    | NoopCommand
    | SubscribeCommand
    | ReceiveCommand
    | ReceiptsCommand
    | AckReceiveCommand
    | DeliverTickCommand
    | LockCommand
    | UnlockCommand
    | CommitFencedCommand
    | RedriveCommand
    | SealSegmentCommand
    | ExpireProducersCommand
    | ExpireSubscriptionsCommand
    | TouchSubscriptionsCommand
)
