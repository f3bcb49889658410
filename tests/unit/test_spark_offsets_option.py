"""The Spark source's offset options (``spark/source.py``): what a user writes, checked before a read."""

from __future__ import annotations

import pytest

from raftmq.spark.source import _parse_offsets


def test_offsets_name_queues_by_their_decimal_numbers() -> None:
    assert _parse_offsets(' {"t": {"0": -2, "2": 5}} ', ["t"], "startingOffsets") == {"t": {0: -2, 2: 5}}
    assert _parse_offsets("Latest", ["t"], "startingOffsets") == "latest"


@pytest.mark.parametrize(
    "raw",
    [
        '{"t": {"\\u00b2": 0}}',  # a superscript two: a digit to str.isdigit, not to int()
        '{"t": {"x": 0}}',
        '{"t": {"0": -3}}',
        '{"t": {"0": "5"}}',
        '{"u": {"0": 0}}',
        '{"t": [0]}',
        "[]",
        "soon",
    ],
)
def test_a_bad_offsets_option_is_a_clear_error_naming_the_option(raw: str) -> None:
    with pytest.raises(ValueError, match="startingOffsets"):
        _parse_offsets(raw, ["t"], "startingOffsets")
