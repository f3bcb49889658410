"""Who may set a queue's RedrivePolicy on a cluster with API tokens (docs/sqs.md, Authentication;
docs/security.md): CreateQueue and SetQueueAttributes alike.

A RedrivePolicy sends the queue's dead letters to its dead-letter queue, so setting one needs
``produce`` or ``admin`` there (:func:`access.authorize_redrive_target`), checked before that queue
is looked up: an answer about a queue the token has no right on would tell of it. A token refused
there may still repeat the queue's current policy (the same dead-letter queue and
``maxReceiveCount``, however written): a tool writing back what it read (Terraform), or ensuring
a queue exists with its attributes at every start (CreateQueue), as the queue's admin who lacks
that right. That changes nothing and needs nothing more.
"""

from __future__ import annotations

from raftmq.cluster.api.handlers.topics import TopicHandlers
from raftmq.cluster.api.sqs import queues as qs
from raftmq.cluster.api.sqs.access import authorize_redrive_target
from raftmq.cluster.api.sqs.errors import SqsError
from raftmq.cluster.base import errors
from raftmq.cluster.base.errors import RaftmqError
from raftmq.cluster.config.tokens import TokenGrant
from raftmq.cluster.machines.metadata import Topic

__all__ = ["current_policy_repeated"]


async def current_policy_repeated(
    action: str, grant: TokenGrant | None, api: TopicHandlers, name: str, attributes: dict[str, str]
) -> Topic | None:
    """The queue ``name`` read at the metadata leader when ``attributes`` (checked, as
    ``queues.check_attributes`` returns them) repeat its current RedrivePolicy and ``grant`` has
    no right on its dead-letter queue: the policy is no change, and the caller sets nothing of
    it and looks at no dead-letter queue. None when the token may set the policy (or there is
    no token, or no policy is set: removing one ("") needs no right); AccessDenied otherwise,
    the queue missing too. Read at the leader: the answering node's replica may lag, and a
    policy taken as no change for matching a stale one was lost while answered success."""
    wanted = qs.parse_redrive_policy(attributes.get(qs.REDRIVE_POLICY))
    if wanted is None or grant is None:
        return None
    try:
        await authorize_redrive_target(action, grant, api.permission_names, wanted.target)
    except SqsError as refused:
        if refused.aws.code != "AccessDenied":
            raise
        try:
            current = await api.topic(name, fresh=True)
        except RaftmqError as e:
            if e.error is not errors.TOPIC_NOT_FOUND:
                raise
            raise refused from None
        if not qs.is_queue(current) or wanted != qs.redrive_policy(current):
            raise
        return current
    return None
