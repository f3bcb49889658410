"""Deploy tests build the root Dockerfile and run docker-compose.yml: they need docker and
docker-compose (``scripts/deploy-test`` installs and starts what is missing, then runs them)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = "raftmq:deploy-test"


def _docker_ok() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


@pytest.fixture(scope="session")
def deploy_image() -> str:
    """The root Dockerfile built on the locally built Debian base (no registry needed), once."""
    if not _docker_ok():
        pytest.fail("docker is not available: run scripts/deploy-test, which installs and starts it")
    from raftmq.chaos.images import BASE_IMAGE, build_base_image

    build_base_image(BASE_IMAGE)  # debootstrap, only when the image is missing (about a minute)
    started = time.monotonic()
    built = subprocess.run(
        ["docker", "build", "-q", "--build-arg", f"BASE={BASE_IMAGE}", "-t", IMAGE, str(REPO)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, f"docker build failed:\n{built.stdout}\n{built.stderr}"
    # The image this tag had before is now untagged: remove it (only the server image's, by label).
    subprocess.run(
        ["docker", "image", "prune", "-f", "--filter", "label=org.raftmq.image=server"], capture_output=True
    )
    print(f"{IMAGE} built on {BASE_IMAGE} in {time.monotonic() - started:.1f} s")
    return IMAGE


@pytest.fixture(scope="session")
def compose_bin() -> list[str]:
    """The compose command: Debian's docker-compose (1.29), else the docker compose plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("neither docker-compose nor `docker compose` is installed: run scripts/deploy-test")
