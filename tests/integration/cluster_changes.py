"""What the cluster-change tests share (``test_membership.py``, ``test_rebalance.py``): background
traffic that remembers every acknowledged message, and reading and waiting for changes in
``GET /v1/cluster/placement``."""

from __future__ import annotations

import threading
import time
from typing import Any

import requests

from .harness import Cluster, wait_until

TOPIC = "orders"
QUEUES = 6  # over 3 queue groups: two queues each


class Traffic:
    """A producer and a consumer of ``TOPIC`` in threads, each with its own HTTP session, round
    robin over ``nodes`` (a removed node can be taken out of the list while it runs)."""

    def __init__(self, c: Cluster, nodes: list[str], batch: int = 10) -> None:
        self.c = c
        self.nodes = list(nodes)
        self.batch = batch
        self.acked: dict[tuple[int, int], str] = {}
        self.seen: dict[int, list[tuple[int, str]]] = {q: [] for q in range(QUEUES)}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce), threading.Thread(target=self._consume)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def wait_for(self, count: int) -> None:
        goal = len(self.acked) + count
        wait_until(lambda: len(self.acked) >= goal, 60, what=f"{count} more acknowledged messages")

    def _url(self, i: int) -> str:
        nodes = self.nodes
        return self.c.nodes[nodes[i % len(nodes)]].url

    def _produce(self) -> None:
        session, i = requests.Session(), 0
        while not self._stop.is_set():
            values = [f"m-{i}-{j}" for j in range(self.batch)]
            try:
                r = session.post(
                    f"{self._url(i)}/v1/topics/{TOPIC}/messages",
                    json={"messages": [{"value": v} for v in values]},
                    timeout=30,
                )
                if r.status_code == 200:
                    for v, res in zip(values, r.json()["results"], strict=True):
                        self.acked[(res["queue"], res["offset"])] = v
                else:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")
            except requests.RequestException as e:
                self.failures.append(repr(e))
            i += 1
            time.sleep(0.02)

    def _consume(self) -> None:
        session, i = requests.Session(), 0
        offsets = dict.fromkeys(range(QUEUES), 0)
        while not self._stop.is_set():
            q = i % QUEUES
            try:
                r = session.get(
                    f"{self._url(i)}/v1/topics/{TOPIC}/queues/{q}/messages",
                    params={"offset": offsets[q], "max": 500},
                    timeout=30,
                )
                if r.status_code == 200:
                    for m in r.json()["messages"]:
                        self.seen[q].append((m["offset"], m["value"]))
                        offsets[q] = m["offset"] + 1
            except requests.RequestException:
                pass
            i += 1
            time.sleep(0.01)


def placement(c: Cluster, node: str | None = None) -> dict[str, Any]:
    """``GET /v1/cluster/placement`` (at ``node``, else the first node)."""
    r = c.get("/v1/cluster/placement", node)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def wait_for_end(c: Cluster, change_id: int, timeout_s: float = 180) -> dict[str, Any]:
    """The record of change ``change_id`` in the placement's history, once it has ended."""

    def ended() -> dict[str, Any] | None:
        r = c.get("/v1/cluster/placement")
        if r.status_code != 200:  # 503 while the metadata group elects its next leader
            return None
        return next((h for h in r.json()["history"] if h["id"] == change_id), None)

    record: dict[str, Any] = wait_until(ended, timeout_s, interval_s=0.5, what=f"change {change_id} to end")
    return record


def run_change(
    c: Cluster, method: str, path: str, body: Any = None, timeout_s: float = 180
) -> dict[str, Any]:
    """Start a change; wait until it ended; return its record (it must have succeeded). A refusal
    that certainly did nothing and passes (the metadata group electing a leader) is retried."""

    def begin() -> requests.Response | None:
        r = c.session.request(method, c.url() + path, json=body, timeout=30)
        error = r.json().get("error", {}) if r.status_code != 202 else {}
        return None if error.get("code") in ("unavailable", "not_leader") else r

    r = wait_until(begin, 30, interval_s=0.5, what=f"{method} {path} accepted")
    assert r.status_code == 202, r.text
    record = wait_for_end(c, r.json()["change"]["id"], timeout_s)
    assert record["outcome"] == "done", record
    return record
