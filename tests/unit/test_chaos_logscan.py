"""chaos/logscan.py on odd log lines: a record whose JSON is not what a structured record holds
(an ``event`` that is not a string, nesting too deep to parse) counts as a traceback and never
crashes the scan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raftmq.chaos.logscan import scan_logs

TB = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: x'


def record(event: Any) -> str:
    return json.dumps({"event": event, "exception": TB})


def test_json_lines_of_any_shape_are_counted_without_crashing(tmp_path: Path) -> None:
    lines = [
        record(["storage_failure_stopping"]),  # an event that cannot be looked up (a list)
        record({"nested": 1}),
        record(7),
        json.dumps({"exception": TB}),  # no event at all
        "{" * 100_000 + " Traceback (most recent call last)",  # deeper than the parser goes
        json.dumps(["Traceback (most recent call last)"]),  # JSON, but not an object
        record("storage_failure_stopping"),
    ]
    (tmp_path / "n1.log").write_text("\n".join(lines) + "\n")
    found = scan_logs(tmp_path)
    assert found["n1"] == {"storage_failure": 2, "traceback": 6, "traceback_expected": 1}
