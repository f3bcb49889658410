"""raftmq.batch's surface: everything its modules make public is exported, and it stays pure
(stdlib, crc32c and numpy, and raftmq.errors, the error root; pyarrow only where it builds Arrow
arrays)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import raftmq.batch

BATCH_DIR = Path(raftmq.batch.__file__).parent
ALLOWED = {"crc32c", "numpy", "pyarrow"}


def test_every_public_name_of_the_modules_is_exported() -> None:
    exported = set(raftmq.batch.__all__)
    for path in BATCH_DIR.glob("_*.py"):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(f"raftmq.batch.{path.stem}")
        missing = {n for n in getattr(module, "__all__", []) if n not in exported}
        # the format module's internal constants are exported only where a caller needs them
        if path.stem == "_format":
            missing -= {"CRC_START", "HEADER_ENTRY_SIZE", "RECORD_ENTRY_SIZE", "STAMP_SIZE"}
        assert not missing, f"{path.name}: {sorted(missing)}"
    assert all(hasattr(raftmq.batch, n) for n in exported)


def test_batch_imports_only_the_standard_library_crc32c_numpy_and_pyarrow() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in BATCH_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                # raftmq.errors: the one error root (BadBatch is its class), which imports nothing.
                allowed = top in stdlib or top in ALLOWED or name == "raftmq.errors"
                assert allowed, f"{path.name} imports {name}"
            if isinstance(node, ast.ImportFrom) and node.module and "pyarrow" in node.module:
                raise AssertionError(f"{path.name}: pyarrow only inside Columns.to_arrow")
    source = (BATCH_DIR / "_columns.py").read_text()
    module_level = [n for n in ast.parse(source).body if isinstance(n, ast.Import)]
    assert all(a.name != "pyarrow" for n in module_level for a in n.names)
