"""The repository stands on its own: no file cites a path outside it.

Code comments, docstrings and docs cite docs/architecture.md (and the other docs), never notes kept
elsewhere. Checked over every file git knows here (tracked or not ignored), or every file under the
root when git is not available:

- no reference to a ``notes/<name>.md`` file, a ``shared`` folder above the root or an absolute
  path on the machine that wrote the code;
- every relative Markdown link resolves to a file inside the repository, and a link's ``#anchor``
  into a Markdown file names one of its headings;
- every ``docs/<name>.md`` named anywhere exists.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SKIP_DIRS = {".git", ".venv", ".tox", "node_modules", "__pycache__", "build", "dist", "typings"}
_SKIP_SUFFIXES = {".png", ".jpg", ".gif", ".ico", ".woff", ".woff2", ".whl", ".gz", ".tar", ".pyc"}

# Split so that this file does not match itself.
_OUTSIDE = [
    re.compile(r"(?<![\w/.-])notes/[\w.-]+\.md"),
    re.compile(r"(?:\.\./)+" + "shared\\b"),
    re.compile(r"\bshared/" + "notes\\b"),
    re.compile(r"/" + r"work/(?:shared|main)\b"),
]
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DOC_REF = re.compile(r"(?<![\w/.-])docs/[\w-]+\.md")


def _files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
        paths = [ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for top, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            paths += [Path(top) / f for f in files]
    return [
        p
        for p in paths
        if p.is_file()
        and not p.is_symlink()
        and p.suffix not in _SKIP_SUFFIXES
        and not set(p.relative_to(ROOT).parts) & _SKIP_DIRS
    ]


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    # Inline code and emphasis marks go, a link keeps its text; underscores stay (as on GitHub).
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    text = _text(path) or ""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M)
    explicit = re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text)
    return frozenset([_slug(h) for h in headings] + explicit)


def _texts() -> list[tuple[Path, str]]:
    me = Path(__file__).resolve()
    out = []
    for path in _files():
        if path.resolve() == me:
            continue
        text = _text(path)
        if text is not None:
            out.append((path, text))
    return out


def test_no_file_cites_notes_or_paths_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path, text in _texts()
        for pattern in _OUTSIDE
        for m in pattern.finditer(text)
    ]
    assert not found, "citations of paths outside the repository (cite docs/architecture.md):\n" + "\n".join(
        found
    )


def test_markdown_links_stay_inside_the_repository_and_resolve() -> None:
    problems = []
    for path, text in _texts():
        if path.suffix != ".md":
            continue
        # Links inside fenced code blocks are examples, not links.
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for m in _MD_LINK.finditer(prose):
            target = m.group(1).strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target == "#":
                continue  # a URL (http:, mailto:) or a bare "#"
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path.resolve()
            where = f"{path.relative_to(ROOT)}: ({target})"
            if not resolved.is_relative_to(ROOT):
                problems.append(f"{where} points outside the repository")
            elif not resolved.exists():
                problems.append(f"{where} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not problems, "\n".join(problems)


def test_every_docs_file_named_exists() -> None:
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: {m.group(0)}"
            for path, text in _texts()
            for m in _DOC_REF.finditer(text)
            if not (ROOT / m.group(0)).exists()
        }
    )
    assert not missing, "\n".join(missing)
