"""The ``raftmq-`` header prefix is the broker's: a produced batch carrying such a header is refused
(``reserved_header``) by the node's check, by a leader receiving a peer's forwarded batches, and in
forwarded JSON batches; stored batches (dead letters carry ``raftmq-dlq-*``) still read."""

from __future__ import annotations

import pytest

from raftmq import batch as rb
from raftmq.cluster.api.handlers.produce import refuse_reserved_headers
from raftmq.cluster.base.errors import ApiError


def batch_of(*headers: dict[str, str] | None) -> bytes:
    b = rb.BatchBuilder()
    for i, h in enumerate(headers):
        b.append(f"m{i}", headers=h)
    return b.finish()


@pytest.mark.parametrize(
    ("name", "reserved"),
    [
        ("raftmq-redrive-group", True),
        ("raftmq-dlq-topic", True),
        ("RAFTMQ-DLQ-REASON", True),
        ("RaftMq-", True),
        ("raftmq", False),
        ("raftmq_x", False),
        ("x-raftmq-dlq", False),
        ("raftmq\u2010dlq", False),  # a Unicode hyphen: not the broker's header
        ("", False),
    ],
)
def test_the_reserved_prefix_is_ascii_case_insensitive(name: str, reserved: bool) -> None:
    assert rb.is_reserved_header(name) is reserved
    view = rb.read(batch_of({name: "v"}))
    assert rb.reserved_header_record(view) == (0 if reserved else None)


def test_validate_names_the_first_record_with_a_reserved_header() -> None:
    forged = {"b": "2", "Raftmq-Redrive-Group": "g"}
    data = batch_of(None, {"a": "1"}, {"x": "1", "raftmq\r": "2"}, forged, None)
    with pytest.raises(rb.BadBatch) as info:
        rb.validate(data, rb.Limits())
    assert (info.value.reason, info.value.record) == ("reserved_header", 3)
    # The same batch as stored or fetched reads (the broker writes such headers itself).
    assert rb.read(data).count == 5
    assert rb.validate(data, rb.Limits(refuse_reserved_headers=False)).count == 5


def test_a_leader_refuses_forwarded_json_batches_with_a_reserved_header() -> None:
    ok = [{"topic_id": 1, "queue": 0, "messages": [{"value": "v", "headers": {"raftmq": "1"}}]}]
    refuse_reserved_headers(ok)
    message = {"value": "v", "headers": {"raftmq-redrive-group": "g"}}
    forged = [*ok, {"topic_id": 1, "queue": 0, "messages": [message]}]
    with pytest.raises(ApiError) as info:
        refuse_reserved_headers(forged)
    assert info.value.code == "reserved_header"
