"""Chaos tests run raftmq nodes in containers: they need docker (``scripts/chaos`` sets it up)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STORE = Path(os.environ.get("RAFTMQ_CHAOS_STORE", REPO / "store"))


@pytest.fixture(scope="session")
def chaos_images() -> str:
    """Build raftmq-base:bookworm (when missing) and raftmq:chaos from the current tree, once."""
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.fail("docker is not available: run scripts/chaos, which installs and starts it")
    from raftmq.chaos.images import APP_IMAGE, build_images

    started = time.monotonic()
    build_images()
    print(f"images built in {time.monotonic() - started:.1f} s")
    return APP_IMAGE


@pytest.fixture
def store() -> Path:
    return STORE
