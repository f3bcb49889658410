"""deploy/systemd/raftmq@.service passes ``systemd-analyze verify`` and keeps its hardening."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

UNIT = REPO / "deploy" / "systemd" / "raftmq@.service"
INSTALLED_BINARY = "/opt/raftmq/bin/raftmq"

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (apt-get install systemd)",
)


def _instance(tmp_path: Path, text: str, name: str = "raftmq") -> Path:
    """The template written to tmp_path with an instance name linked to it (as systemctl does)."""
    template = tmp_path / f"{name}@.service"
    template.write_text(text)
    instance = tmp_path / f"{name}@n1.service"
    instance.symlink_to(template.name)
    return instance


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )


def test_unit_verifies_cleanly(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this environment's raftmq.
    text = UNIT.read_text()
    assert INSTALLED_BINARY in text
    here = Path(sys.executable).parent / "raftmq"
    assert here.exists(), f"raftmq is not installed next to {sys.executable}"
    done = _verify(_instance(tmp_path, text.replace(INSTALLED_BINARY, str(here))))
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("Restart=on-failure", "Restart=sometimes\nRestartPolicy=on-failure")
    done = _verify(_instance(tmp_path, broken))
    assert "Failed to parse service restart specifier" in done.stderr
    assert "Unknown key 'RestartPolicy'" in done.stderr


def test_unit_is_hardened(tmp_path: Path) -> None:
    """systemd's own exposure score (0 = locked down, 10 = unprotected) stays low."""
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", "--threshold=25",  # exposure 2.5 of 10
         str(_instance(tmp_path, UNIT.read_text()))],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "Overall exposure level" in done.stdout
    text = UNIT.read_text()
    for setting in ("LimitNOFILE=65536", "Restart=on-failure", "EnvironmentFile=/etc/raftmq/raftmq.env"):
        assert setting in text
