"""Loading a benchmark script of tests/bench as a module, for the unit tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

__all__ = ["loaded_bench"]

BENCH = Path(__file__).resolve().parents[1] / "bench"


def loaded_bench(name: str) -> Iterator[ModuleType]:
    """A fixture's body: ``tests/bench/<name>.py`` as the module ``name``; the import path entries
    it adds (tests/bench and the repository, whose docker/ folder would shadow docker-py) are
    taken out again, and the modules it brought in (itself and ``_common``) dropped at the end."""
    path, modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    yield module
    for loaded in (name, "_common"):
        if loaded not in modules:
            sys.modules.pop(loaded, None)
