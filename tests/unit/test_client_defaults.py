"""The clients' keyword defaults are the ones their settings dataclasses declare (a signature
written out by hand drifted once: ``Consumer(max_batch=...)`` said 500 while ``ConsumerConfig`` and
the docs said 32). The subscribers take ``**options`` checked against ``SubscriberConfig`` itself."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from raftmq.client import AsyncConsumer, AsyncProducer, Consumer, Producer
from raftmq.client._consumer_config import ConsumerConfig
from raftmq.client._producer_config import ProducerConfig


def _field_defaults(config: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize(
    ("client", "config"),
    [
        (AsyncConsumer, ConsumerConfig),
        (Consumer, ConsumerConfig),
        (AsyncProducer, ProducerConfig),
        (Producer, ProducerConfig),
    ],
)
def test_signature_defaults_match_the_settings(client: type, config: type) -> None:
    declared = _field_defaults(config)
    params = inspect.signature(client.__init__).parameters
    compared = {name: p.default for name, p in params.items() if name in declared}
    assert compared, f"{client.__name__} shares no setting with {config.__name__}"
    assert compared == {name: declared[name] for name in compared}
