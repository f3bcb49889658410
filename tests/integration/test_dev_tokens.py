"""``raftmq dev`` on a cluster file that lists API tokens: its hints work as printed, and show none
(nor does the node's log).

Before, the ``Try:`` curl had no Authorization header: run as printed it got 401 unauthorized, and
nothing said which token to send or where it is (docs/security.md, API tokens)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from .harness import Cluster, tokens_toml, wait_until
from .test_cli import read_lines

TOKEN = "dev-admin-token-0123456789abcdef"


@pytest.mark.timeout(180)
def test_dev_hints_send_the_token_and_say_where_it_is_without_showing_it(tmp_path: Path) -> None:
    # The harness writes the cluster file (free ports, one node) where `raftmq dev --dir` reads it.
    tokens = tokens_toml([("admin", TOKEN, '["*"]', "[]", "[]")])
    with Cluster(tmp_path, nodes=1, extra_toml=tokens) as c:
        cluster_file = (tmp_path / "cluster.toml").resolve()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAFTMQ_TOKEN", "RAFTMQ_URL"))}
        dev = subprocess.Popen(
            [sys.executable, "-m", "raftmq.cluster.cli.main", "dev", "--dir", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        lines: list[str] = []
        threading.Thread(target=read_lines, args=(dev.stdout, lines), daemon=True).start()
        pids: list[int] = []
        try:
            wait_until(lambda: any(x.startswith("Ctrl-C stops") for x in lines), 90, what="dev's hints")
            output = "".join(lines)
            pids = [int(p) for p in re.findall(r"^\s+n\d\s+\S+\s+pid (\d+)", output, re.M)]
            assert TOKEN not in output
            tried = next(x for x in lines if x.startswith("Try:")).removeprefix("Try:").strip()
            assert '-H "Authorization: Bearer $RAFTMQ_TOKEN"' in tried, output
            said = [x for x in lines if x.startswith("API tokens are on")]
            where = f"('admin'): export RAFTMQ_TOKEN=<its token = in {cluster_file}>"
            assert said and where in said[0], output
            # Run as printed, with the token where the hint says to put it: the topic is created.
            done = subprocess.run(
                ["bash", "-c", tried], env={**env, "RAFTMQ_TOKEN": TOKEN}, capture_output=True, text=True
            )
            assert done.returncode == 0 and '"orders"' in done.stdout, (tried, done.stdout, done.stderr)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            status = lines[lines.index(next(x for x in lines if x.startswith("Try:"))) + 1].strip()
            done = subprocess.run(
                ["bash", "-c", status], env={**env, "RAFTMQ_TOKEN": TOKEN}, capture_output=True, text=True
            )
            assert done.returncode == 0 and "1/1 nodes reachable" in done.stdout, (status, done.stderr)
            described = requests.get(c.url("n1") + "/v1/topics/orders", headers=auth, timeout=10)
            assert described.status_code == 200, described.text
            dev.send_signal(signal.SIGINT)
            assert dev.wait(40) == 0
            # Nor in the node's log (the path dev printed), which saw the file and the requests.
            (log,) = re.findall(r"^\s+n1\s+\S+\s+pid \d+\s+log (\S+)$", output, re.M)
            logged = Path(log).read_text()
            assert "n1" in logged and TOKEN not in logged, log
        finally:
            if dev.poll() is None:
                dev.kill()
                dev.wait(10)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
