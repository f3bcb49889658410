"""The root Dockerfile's build context (.dockerignore lets in only what it names) holds every
package folder pyproject installs: a new top-level package left out fails the image build with
"package directory ... does not exist", which only the deploy tests would find."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_docker_build_context() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {d.split("/")[0] for d in pyproject["tool"]["setuptools"]["package-dir"].values()}
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert folders, "pyproject names no package folders"
    assert folders <= allowed, f"not in .dockerignore's allow list: {sorted(folders - allowed)}"
