"""docs/architecture.md names the pysyncobj 0.3.17 source files its facts were read from.

The sentence names pysyncobj's own modules, not raftmq's: moving raftmq's modules into rooms
once rewrote ``journal.py`` and ``config.py`` there into raftmq paths (``replication/journal.py``,
``config/cluster_file.py``), which pysyncobj does not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import pysyncobj

ROOT = Path(__file__).resolve().parents[2]


def test_the_files_the_pysyncobj_section_was_read_from_are_pysyncobj_modules() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    sentence = re.search(r"Read from the 0\.3\.17 source \(([^)]*)\)", text)
    assert sentence is not None, "the pysyncobj section no longer says what it was read from"
    names = re.findall(r"`([^`]+)`", sentence.group(1))
    assert "syncobj.py" in names
    package = Path(pysyncobj.__file__).parent
    missing = [n for n in names if not (package / n).is_file()]
    assert missing == [], f"not pysyncobj modules: {missing}"
