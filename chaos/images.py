"""Container images without a registry.

``raftmq-base:bookworm`` is Debian bookworm from debootstrap (``--variant=minbase`` plus python3,
python3-venv, iproute2, iptables and faketime), imported with ``docker import``: about a minute, once
per machine. ``raftmq:chaos`` is ``docker/Dockerfile`` on top of it, installing wheels that were built
on the host (``pip wheel``), so the docker build itself needs no network.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "APP_IMAGE",
    "BASE_IMAGE",
    "build_app_image",
    "build_base_image",
    "build_images",
    "debian_mirror",
    "image_exists",
]

log = logging.getLogger("raftmq.chaos.images")

BASE_IMAGE = "raftmq-base:bookworm"
APP_IMAGE = "raftmq:chaos"


def _repo_root() -> Path:
    """The source tree (with docker/Dockerfile): $RAFTMQ_REPO, else the tree this package was
    installed from in editable mode, else the working directory."""
    candidates = [Path(os.environ["RAFTMQ_REPO"])] if "RAFTMQ_REPO" in os.environ else []
    candidates += [Path(__file__).resolve().parent.parent, Path.cwd()]
    for path in candidates:
        if (path / "docker" / "Dockerfile").exists() and (path / "pyproject.toml").exists():
            return path
    raise RuntimeError("cannot find the raftmq source tree (docker/Dockerfile); set RAFTMQ_REPO")


REPO_ROOT = _repo_root()
DOCKER_DIR = REPO_ROOT / "docker"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = "python3,python3-venv,iproute2,iptables,faketime"


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The first Debian mirror this machine's apt uses (deb822 ``URIs:`` or a one-line ``deb``)."""
    candidates = [*sorted(sources_dir.glob("sources.list.d/*.sources")), sources_dir / "sources.list"]
    candidates += sorted(sources_dir.glob("sources.list.d/*.list"))
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            m = re.match(r"\s*URIs:\s*(\S+)", line) or re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)", line)
            if m and "security" not in m.group(1) and "debian" in m.group(1):
                return m.group(1).rstrip("/")
    return DEFAULT_MIRROR


def build_base_image(tag: str = BASE_IMAGE, mirror: str | None = None, force: bool = False) -> bool:
    """Build the Debian base image with debootstrap unless it exists. Returns True if built."""
    if not force and image_exists(tag):
        log.info("base image %s present", tag)
        return False
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install -y debootstrap)")
    mirror = mirror or debian_mirror()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftmq-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        )
        subprocess.run(
            ["docker", "import", "-c", "ENV LANG=C.UTF-8", "-", tag],
            stdin=tar.stdout,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap root failed")
    log.info("built %s in %.0f s", tag, time.monotonic() - started)
    return True


def build_wheelhouse(wheelhouse: Path = DOCKER_DIR / "wheelhouse") -> None:
    """Wheels of raftmq and all its dependencies for the image. Dependencies already in the
    wheelhouse are reused offline; only when that fails is the package index asked."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for old in wheelhouse.glob("raftmq-*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q", "-w", str(wheelhouse)]
    offline = subprocess.run(
        [*pip, "--no-index", "--find-links", str(wheelhouse), str(REPO_ROOT)], capture_output=True, text=True
    )
    if offline.returncode != 0:
        reason = [ln for ln in offline.stderr.splitlines() if "ERROR" in ln][-1:] or ["?"]
        log.info("wheelhouse incomplete (%s), building it from the package index", reason[0])
        subprocess.run([*pip, str(REPO_ROOT), "setuptools>=68", "wheel"], check=True)
    # raftmq's own wheel goes apart, so the image's dependency layer stays cached (docker/Dockerfile).
    app = wheelhouse.parent / "app"
    shutil.rmtree(app, ignore_errors=True)
    app.mkdir()
    for built in wheelhouse.glob("raftmq-*.whl"):
        built.rename(app / built.name)


def build_app_image(tag: str = APP_IMAGE, base: str = BASE_IMAGE) -> None:
    """Build ``docker/Dockerfile`` on ``base`` from a fresh wheelhouse (docker caches the layers)."""
    started = time.monotonic()
    build_wheelhouse()
    built = subprocess.run(
        ["docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", tag, str(DOCKER_DIR)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:  # its stderr otherwise only says the legacy builder is deprecated
        raise RuntimeError(f"docker build of {tag} failed:\n{built.stdout}\n{built.stderr}")
    # The image this tag had before is now untagged: remove it (and only raftmq's).
    subprocess.run(
        ["docker", "image", "prune", "-f", "--filter", "label=org.raftmq.image=node"], capture_output=True
    )
    log.info("built %s in %.1f s", tag, time.monotonic() - started)


def build_images(base: str = BASE_IMAGE, app: str = APP_IMAGE, force_base: bool = False) -> None:
    """Both images: the base only when it is missing (or forced), the app image every time."""
    build_base_image(base, force=force_base)
    build_app_image(app, base)
