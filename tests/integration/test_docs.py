"""Every Python and shell block of README.md and docs/*.md runs as written against a local 3-node
cluster like ``./scripts/dev``'s (issue 21: client.md's quick start named ports 7001-7003, made a
topic the README had made, and called a function it never defined).

How the blocks run (docs/index.md says this to writers):
- Fenced blocks tagged ``python``, ``sh`` or ``bash`` run; others (``json``, ``toml``, untagged, ...)
  are text. A block whose fence is preceded by the line ``<!-- docs-test: skip (why) -->`` is not
  run: commands for other hosts, TLS, docker, Spark sessions, API signatures, long benchmarks.
- The files run in a reader's order (README.md, quickstart.md, client.md, then the others by name)
  against one cluster, so a page must work after the pages before it (a topic may exist already).
  Within a page, blocks run in order; the Python blocks of a page share one interpreter, as in a
  session following the page; the shell blocks run with bash -e in one working folder per page.
- The cluster is started as ``./scripts/dev`` starts it (3 nodes, no tokens, fsync) on free ports:
  ``localhost:8081``-``8083`` and ``127.0.0.1:8081``-``8083`` in a block are replaced by its ports
  (another run may hold 8081-8083), and the working folder holds ``.raftmq/cluster.toml`` and
  ``.venv``, as the repository does after ``./scripts/dev``. ``.venv/bin`` is NOT on PATH (taken
  off it when the venv is active), as for a reader who ran ``./scripts/dev``: a block calls
  ``.venv/bin/raftmq`` and ``.venv/bin/python`` (a newcomer typing client.md's ``raftmq produce``
  got "command not found").
- A ``curl`` answer with an HTTP error fails its block (curl itself exits 0 on those), except
  ``409 topic_exists``: README.md and quickstart.md both walk through creating ``orders``, as a
  second run of either would. Each block has 60 seconds.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import Cluster

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
FIRST = ["README.md", "docs/quickstart.md", "docs/client.md"]
DOCS = FIRST + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if str(p.relative_to(ROOT)) not in FIRST
)
RUNS = {"python": "python", "sh": "sh", "bash": "sh"}
SKIP = re.compile(r"<!-- docs-test: skip \((?P<why>[^)]+)\) -->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```\s*$", re.S | re.M)
DEV_ADDRESS = re.compile(r"\b(localhost|127\.0\.0\.1):(808[123])\b")
BLOCK_S = 60.0

# curl as the blocks call it, failing on an HTTP error answer (but 409 topic_exists); the answer is
# printed as curl prints it.
CURL = r"""
curl() {
    local out status
    out=$(command curl -sS -w '\n%{http_code}' "$@") || return
    status=${out##*$'\n'}
    out=${out%$'\n'*}
    printf '%s\n' "$out"
    if [ "$status" -ge 400 ] && ! { [ "$status" = 409 ] && [[ $out == *'"topic_exists"'* ]]; }; then
        echo "curl $*: HTTP $status" >&2
        return 22
    fi
}
"""

# Runs the Python blocks of one page in one namespace: a JSON line per block on stdin, a JSON line
# per result on stdout (the blocks' own output goes to stderr).
RUNNER = r"""
import contextlib, json, sys, traceback
namespace = {"__name__": "__main__"}
protocol = sys.stdout
for line in sys.stdin:
    block = json.loads(line)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            exec(compile(block["code"], block["name"], "exec"), namespace)
        result = {"ok": True}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    protocol.write(json.dumps(result) + "\n")
    protocol.flush()
"""


@dataclass(frozen=True)
class Block:
    path: str
    line: int
    lang: str  # "python" or "sh"
    code: str
    skip: str | None  # why it is not run

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(path: str) -> list[Block]:
    text = (ROOT / path).read_text()
    out = []
    for m in FENCE.finditer(text):
        lang = RUNS.get(m.group("lang"))
        if lang is None:
            continue
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.match(before.strip())
        line = text[: m.start()].count("\n") + 1
        out.append(Block(path, line, lang, m.group("body"), skip.group("why") if skip else None))
    return out


def test_every_runnable_block_is_found_and_every_skip_says_why() -> None:
    """The extraction itself: the README's walk through and client.md's quick start are runnable
    blocks; a skip marker names its reason; no marker is left dangling (before no block)."""
    readme = [b for b in blocks("README.md") if b.skip is None]
    assert any("curl -s -XPOST localhost:8081/v1/topics" in b.code for b in readme)
    client = [b for b in blocks("docs/client.md") if b.skip is None and b.lang == "python"]
    assert any("Producer(nodes)" in b.code for b in client)
    for path in DOCS:
        text = (ROOT / path).read_text()
        markers = len(re.findall(r"^<!-- docs-test: skip", text, re.M))
        assert markers == sum(1 for b in blocks(path) if b.skip), f"{path}: a skip marker before no block"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[str, str]]]:
    """The cluster, and the address map: each of the dev cluster's addresses to this cluster's."""
    with Cluster(tmp_path_factory.mktemp("docs"), nodes=3, extra_toml='durability = "fsync"') as cluster:
        cluster.start()
        cluster.wait_ready()
        ports = {f"808{i}": cluster.nodes[f"n{i}"].http.rsplit(":", 1)[1] for i in (1, 2, 3)}
        yield cluster, ports


def _workdir(tmp: Path, cluster: Cluster) -> Path:
    work = tmp / "work"
    (work / ".raftmq").mkdir(parents=True)
    (work / ".raftmq" / "cluster.toml").symlink_to(cluster.config_path)
    (work / ".venv").symlink_to(ROOT / ".venv")
    return work


def _env(work: Path) -> dict[str, str]:
    """A reader's shell: no RAFTMQ_ variable, no active venv (its bin off PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_") and k != "VIRTUAL_ENV"}
    venv_bins = {os.path.realpath(ROOT / ".venv" / "bin")}
    if sys.prefix != sys.base_prefix:  # run from a venv: its bin too (never /usr/bin of a system python)
        venv_bins.add(os.path.realpath(Path(sys.executable).parent))
    dirs = env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    path = [d for d in dirs if d and os.path.realpath(d) not in venv_bins]
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class PythonSession:
    """One interpreter for the Python blocks of a page."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER],
            cwd=work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(work / "python-output.txt", "w"),  # noqa: SIM115 (closed with the process)
            text=True,
        )

    def run(self, block: Block, code: str) -> str | None:
        """None when the block ran, else what went wrong."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "name": block.name}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], BLOCK_S)
        if not ready:
            self.close()
            return f"still running after {BLOCK_S:.0f} s"
        line = self.proc.stdout.readline()
        if not line:
            return f"the interpreter exited ({self.proc.wait()})"
        result = json.loads(line)
        return None if result["ok"] else str(result["error"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _tail(output: str | bytes | None) -> str:
    text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
    return text[-2500:]


def _run_shell(block: Block, code: str, work: Path, env: dict[str, str]) -> str | None:
    try:
        done = subprocess.run(
            ["bash", "-e", "-x", "-o", "pipefail", "-c", CURL + code],  # -x: the commands on stderr
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        return f"still running after {BLOCK_S:.0f} s\nstderr: {_tail(e.stderr)}"
    if done.returncode != 0:
        return f"exit {done.returncode}\nstdout: {_tail(done.stdout)}\nstderr: {_tail(done.stderr)}"
    return None


@pytest.mark.parametrize("path", DOCS)
def test_the_blocks_of_a_page_run_against_a_dev_cluster(
    path: str, dev: tuple[Cluster, dict[str, str]], tmp_path: Path
) -> None:
    cluster, ports = dev
    runnable = [b for b in blocks(path) if b.skip is None]
    if not runnable:
        pytest.skip(f"{path}: no runnable block")
    work = _workdir(tmp_path, cluster)
    env = _env(work)
    python = PythonSession(work, env)
    failures = []
    try:
        for block in runnable:
            code = DEV_ADDRESS.sub(lambda m: f"{m.group(1)}:{ports[m.group(2)]}", block.code)
            error = python.run(block, code) if block.lang == "python" else _run_shell(block, code, work, env)
            if error is not None:
                failures.append(f"{block.name} ({block.lang}): {error}")
                if block.lang == "python" and python.proc.poll() is not None:
                    break  # (timed out: the session is gone, and the later blocks may need it)
    finally:
        python.close()
    output = (work / "python-output.txt").read_text()[-3000:]
    assert not failures, "\n\n".join(failures) + f"\n\nPython blocks' output:\n{output}"
