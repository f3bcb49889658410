"""The CLI's summaries (cluster/cli/progress.py): rates in the singular when they round to one,
and the same bytes for the same messages in produce, consume and receive (issue 21, item 8)."""

from __future__ import annotations

import base64

import pytest

from raftmq.cluster.cli.delivery import received_value_bytes
from raftmq.cluster.cli.progress import Tally, per_second, summary, value_bytes


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        (0.4, "0 messages/s"),
        (1.0, "1 message/s"),
        (1.4, "1 message/s"),
        (1.6, "2 messages/s"),
        (12_345.0, "12,345 messages/s"),
    ],
)
def test_a_rate_is_singular_only_when_it_reads_one(rate: float, text: str) -> None:
    assert per_second(rate) == text


def test_the_summary_of_one_message_a_second_says_message_per_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tally = Tally("produced", count=1, size=4, started=10.0, ended=11.0)
    summary(tally, quiet=False, as_json=False)
    assert capsys.readouterr().err == "produced 1 message (0.00 MB) in 1.00 s: 1 message/s, 0.00 MB/s\n"


@pytest.mark.parametrize("value", ["", "order 7", "é€😀", b"\x00\xff\x10", b"abcd", b"abcde"])
def test_a_received_value_counts_its_stored_bytes_as_produce_and_consume_count_them(
    value: str | bytes,
) -> None:
    stored = value if isinstance(value, bytes) else value.encode()
    wire = {"value_b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else {"value": value}
    assert received_value_bytes(wire) == value_bytes(value) == len(stored)
