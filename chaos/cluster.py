"""A raftmq cluster of 1, 3 or 5 nodes as containers, through testcontainers, with the knobs faults need.

Shape of one cluster:

- a user-defined docker network. Docker picks a free subnet (a probe network is created and removed),
  then the real network is created on that subnet so that every node gets a fixed address: a node
  that restarts comes back on the same IP, so peers' cached DNS answers (pysyncobj caches them for
  ten minutes) stay right. Every container also lists every node in ``/etc/hosts``.
- one container per node, named by its network alias (``n1`` ...), running ``raftmq serve`` under
  libfaketime (``docker/entrypoint.sh``) with ``cap_add=NET_ADMIN`` for iptables. Never
  ``CAP_SYS_TIME``: the clock is not namespaced, so that would move the host's clock.
- per node a host directory mounted at ``/data`` (read-write) that survives restarts. When the
  harness runs as root it is a small tmpfs, so that "disk full" can fill it without touching the
  host's disk.
- the HTTP port (8080) of every node mapped to a random port on 127.0.0.1 for the clients; it
  changes on every restart, so ``url()`` re-reads it.

Everything is labelled ``raftmq.chaos`` with the owning process; leftovers of dead owners are removed
on start, and ``stop()`` removes the cluster's containers before its network.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# testcontainers reads these when it is imported. Ryuk (the reaper) is an image we cannot pull; the
# machine has /.dockerenv, so without TC_HOST testcontainers would look for docker at the default
# gateway, outside this machine.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TC_HOST", "localhost")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")

from docker.types import EndpointConfig, IPAMConfig, IPAMPool
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

import docker
from raftmq.cluster.config.keys import PEER_HEADER, derive_keys

from .client import NodeDown
from .images import APP_IMAGE
from .powerloss_fs import LossyMount

__all__ = ["ChaosCluster", "cleanup_stale"]

log = logging.getLogger("raftmq.chaos.cluster")

LABEL = "raftmq.chaos"
LABEL_OWNER = "raftmq.chaos.owner"
HTTP_PORT = 8080
RAFT_PORT = 7100
SECRET = "chaos-secret-0123456789abcdef"
CHECKPOINT_FAULT_FILE = "checkpoint-fetch-fault"  # in each volume; the nodes' [faults] point at it
VOLUMES_ROOT = Path(tempfile.gettempdir()) / "raftmq-chaos"
OWNER = f"{socket.gethostname()}:{os.getpid()}"


def _owner_alive(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mounts_under(root: Path) -> list[str]:
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1] for line in lines if len(line.split()) > 1]
    return sorted((p for p in points if p.startswith(str(root) + "/")), reverse=True)


def _umount(path: str) -> None:
    os.system(f"umount -l '{path}' 2>/dev/null")


def _answers_http(url: str) -> bool:
    """Any HTTP answer from ``url`` (the process listens), as opposed to a refused or reset
    connection."""
    try:
        urllib.request.urlopen(url + "/healthz", timeout=1.0).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, http.client.HTTPException):
        return False
    return True


def cleanup_stale(client: docker.DockerClient | None = None, only_owner: str | None = None) -> int:
    """Remove chaos containers and networks whose owning process is gone (or, with ``only_owner``,
    those of that owner), containers first. Returns how many containers were removed."""
    client = client or docker.from_env()

    def doomed(labels: dict[str, str]) -> bool:
        owner = labels.get(LABEL_OWNER, "")
        return owner == only_owner if only_owner else not _owner_alive(owner)

    removed = 0
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        if doomed(c.labels):
            try:
                c.remove(force=True, v=True)
                removed += 1
            except docker.errors.NotFound:
                pass
    for n in client.networks.list(filters={"label": LABEL}):
        if doomed(n.attrs.get("Labels") or {}):
            try:
                n.remove()
            except docker.errors.APIError as e:
                log.warning("could not remove network %s: %s", n.name, e)
    if VOLUMES_ROOT.exists():
        for run_dir in VOLUMES_ROOT.iterdir():
            owner_file = run_dir / "owner"
            owner = owner_file.read_text().strip() if owner_file.exists() else ""
            if (owner == only_owner) if only_owner else not _owner_alive(owner):
                for point in _mounts_under(run_dir):
                    _umount(point)
                shutil.rmtree(run_dir, ignore_errors=True)
    return removed


class ChaosCluster:
    """Nodes ``n1..nN`` in containers. Blocking methods (docker calls): run them in threads from
    async code."""

    def __init__(
        self,
        nodes: int = 3,
        *,
        image: str = APP_IMAGE,
        queue_groups: int | None = None,
        env: dict[str, str] | None = None,
        disk_mb: int = 256,
        request_timeout_ms: int = 5000,
        extra_toml: str = "",
        power_loss: bool = False,
    ) -> None:
        self.node_ids = [f"n{i}" for i in range(1, nodes + 1)]
        self.image = image
        self.queue_groups = queue_groups or nodes
        self.env = dict(env or {})
        self.disk_mb = disk_mb
        self.request_timeout_ms = request_timeout_ms
        self.extra_toml = extra_toml
        self.docker = docker.from_env()
        self.run_id = f"{int(time.time())}-{os.getpid()}"
        self.dir = VOLUMES_ROOT / self.run_id
        self.ips: dict[str, str] = {}
        self.containers: dict[str, DockerContainer] = {}
        self.network: Network | None = None
        self.disk_limited = False
        self._urls: dict[str, str] = {}
        # With power_loss, each volume is the power-loss file system (chaos/powerloss_fs.py) over a
        # directory of <run>/<node>.disk, the tmpfs when run as root.
        self.power_loss_fs = power_loss
        self.mounts: dict[str, LossyMount] = {}
        # What a running nemesis keeps between its start and its stop (by fault name).
        self.nemesis_state: dict[str, Any] = {}

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, ready_timeout_s: float = 90) -> None:
        cleanup_stale(self.docker)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "owner").write_text(OWNER)
        subnet = self._pick_subnet()
        hosts = list(ipaddress.ip_network(subnet).hosts())
        self.ips = {nid: str(hosts[9 + i]) for i, nid in enumerate(self.node_ids)}
        self.network = Network(
            docker_network_kw={
                "ipam": IPAMConfig(pool_configs=[IPAMPool(subnet=subnet)]),
                "labels": {LABEL: "1", LABEL_OWNER: OWNER},
            }
        ).create()
        self._write_cluster_file()
        for nid in self.node_ids:
            self._make_volume(nid)
        with ThreadPoolExecutor(len(self.node_ids)) as pool:
            list(pool.map(self._start_container, self.node_ids))
        self.wait_ready(timeout_s=ready_timeout_s)

    def stop(self, logs_to: Path | None = None) -> None:
        """Remove the containers (saving their logs first), then the network and the volumes."""
        for nid, c in self.containers.items():
            try:
                wrapped = c.get_wrapped_container()
                if logs_to is not None:
                    logs_to.mkdir(parents=True, exist_ok=True)
                    (logs_to / f"{nid}.log").write_bytes(wrapped.logs())
                if self._status(nid) == "paused":
                    wrapped.unpause()
                wrapped.remove(force=True, v=True)
            except Exception as e:
                log.warning("removing %s: %s", nid, e)
        self.containers.clear()
        for nid, mount in self.mounts.items():
            mount.unmount()
            if logs_to is not None and mount.log_path.exists():
                shutil.copy(mount.log_path, logs_to / f"{nid}.powerloss.log")
        cleanup_stale(self.docker, only_owner=OWNER)
        self.network = None

    def __enter__(self) -> ChaosCluster:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _pick_subnet(self) -> str:
        """Let docker choose a free subnet, then keep it for a network with fixed addresses."""
        probe = self.docker.networks.create(f"raftmq-chaos-probe-{self.run_id}", labels={LABEL: "1"})
        try:
            probe.reload()
            return str(probe.attrs["IPAM"]["Config"][0]["Subnet"])
        finally:
            probe.remove()

    def _write_cluster_file(self) -> None:
        lines = [
            "[cluster]",
            f'secret = "{SECRET}"',
            f"queue_groups = {self.queue_groups}",
            f"replication = {min(3, len(self.node_ids))}",  # one node: 1, a lone voter
            "[limits]",
            f"request_timeout_ms = {self.request_timeout_ms}",
            # The nodes serve HTTP on their addresses of the run's own docker network (not loopback),
            # which needs tokens or this; the workload sends no token (docs/chaos.md, "The cluster").
            "[security]",
            "allow_unauthenticated = true",
            self.extra_toml,
        ]
        for nid in self.node_ids:
            lines += [
                "[[nodes]]",
                f'id = "{nid}"',
                f'http = "{nid}:{HTTP_PORT}"',
                f'raft = "{nid}:{RAFT_PORT}"',
                'data_dir = "/data"',
            ]
        (self.dir / "cluster.toml").write_text("\n".join(lines) + "\n")

    def _make_volume(self, nid: str) -> None:
        path = self.dir / f"{nid}.disk" if self.power_loss_fs else self.volume(nid)
        path.mkdir(parents=True, exist_ok=True)
        limited = False
        if os.geteuid() == 0:
            limited = os.system(f"mount -t tmpfs -o size={self.disk_mb}m tmpfs '{path}' 2>/dev/null") == 0
        self.disk_limited = limited and (self.disk_limited or nid == self.node_ids[0])
        if self.power_loss_fs:
            self.mounts[nid] = LossyMount(path, self.volume(nid))
            self.mounts[nid].mount()
        self._write_control(nid, "faketime", "+0\n")

    def _write_control(self, nid: str, name: str, text: str) -> None:
        """A file the harness hands a node in its volume, written durably (a power loss keeps it)."""
        path = self.volume(nid) / name
        path.write_text(text)
        for target in (path, path.parent):
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _start_container(self, nid: str) -> None:
        assert self.network is not None
        api_version = self.docker.api.api_version
        others = {other: ip for other, ip in self.ips.items()}
        c = (
            DockerContainer(self.image)
            .with_name(f"raftmq-chaos-{self.run_id}-{nid}")
            .with_command(
                ["raftmq", "serve", "--config", "/etc/raftmq/cluster.toml", "--node", nid, "--json-logs"]
            )
            .with_env("RAFTMQ_FAKETIME", "1")
            .with_env("RAFTMQ_FAULTS_CHECKPOINT_FETCH_FAULT_FILE", f"/data/{CHECKPOINT_FAULT_FILE}")
            .with_volume_mapping(self.volume(nid), "/data", "rw")
            .with_volume_mapping(self.dir / "cluster.toml", "/etc/raftmq/cluster.toml", "ro")
            .with_exposed_ports(HTTP_PORT)
            .with_kwargs(
                hostname=nid,
                cap_add=["NET_ADMIN"],
                labels={LABEL: "1", LABEL_OWNER: OWNER},
                extra_hosts=others,
                network=self.network.name,
                networking_config={
                    self.network.name: EndpointConfig(api_version, aliases=[nid], ipv4_address=self.ips[nid])
                },
            )
        )
        # A random host port on the loopback only (docker-py's (host_ip,) form of a binding).
        c.ports[f"{HTTP_PORT}/tcp"] = ("127.0.0.1",)  # type: ignore[assignment]
        c.ports.pop(str(HTTP_PORT), None)
        for key, value in self.env.items():
            c.with_env(key, value)
        c.start()
        self.containers[nid] = c
        self._refresh_url(nid)

    # -- addresses ------------------------------------------------------------------------------------

    def raft_addresses(self, nid: str) -> list[tuple[str, int]]:
        """The node's Raft ports (the metadata group's, then each queue group's) on its IP."""
        return [(self.ips[nid], RAFT_PORT + offset) for offset in range(self.queue_groups + 1)]

    def volume(self, nid: str) -> Path:
        return self.dir / nid

    def url(self, nid: str) -> str:
        """The node's HTTP base URL from the host; raises NodeDown when it has none (stopped)."""
        try:
            return self._urls[nid]
        except KeyError:
            raise NodeDown(nid) from None

    def _refresh_url(self, nid: str) -> None:
        wrapped = self.containers[nid].get_wrapped_container()
        for _ in range(50):
            wrapped.reload()
            bindings = (wrapped.attrs["NetworkSettings"]["Ports"] or {}).get(f"{HTTP_PORT}/tcp")
            if bindings:
                self._urls[nid] = f"http://127.0.0.1:{bindings[0]['HostPort']}"
                return
            time.sleep(0.05)
        raise RuntimeError(f"{nid} has no mapped HTTP port")

    # -- state ------------------------------------------------------------------------------------

    def _status(self, nid: str) -> str:
        wrapped = self.containers[nid].get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)

    def running(self, nid: str) -> bool:
        """Running and not paused."""
        return self._status(nid) == "running"

    def status(self) -> dict[str, str]:
        return {nid: self._status(nid) for nid in self.node_ids}

    def _get_json(
        self, nid: str, path: str, timeout_s: float = 2.0, secret: bool = False, method: str = "GET"
    ) -> Any:
        req = urllib.request.Request(self.url(nid) + path, method=method)
        if secret:
            req.add_header(PEER_HEADER, derive_keys(SECRET).peer)
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())

    def ready(self, nid: str) -> bool:
        try:
            self._get_json(nid, "/readyz")
            return True
        except (OSError, NodeDown, ValueError):
            return False

    def wait_ready(self, nodes: Iterable[str] | None = None, timeout_s: float = 90) -> None:
        """Until /readyz answers 200 on every given node (default all)."""
        pending = list(nodes or self.node_ids)
        deadline = time.monotonic() + timeout_s
        while pending:
            pending = [nid for nid in pending if not self.ready(nid)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not ready after {timeout_s:.0f} s: {pending} ({self.status()})")
            time.sleep(0.1)

    def leader(self, group: str) -> str | None:
        """The running node that claims to lead ``group`` ("meta" or "0", "1", ...) with the highest
        term, or None. One node is its groups' only voter, so their leader whenever it runs, or about
        to be: the first one-node runs found it leaderless for 1-1.6 s after each restart (an
        election timeout; since fixed in the raft layer, commit 553ad54), and a leader's fault
        planned then hit nothing. Not asking also spares a status request to a node replaying
        its journal under load."""
        if len(self.node_ids) == 1:
            return self.node_ids[0] if self.running(self.node_ids[0]) else None
        best: tuple[int, str] | None = None
        for nid in self.node_ids:
            try:
                g = self._get_json(nid, "/internal/status", secret=True)["groups"].get(group)
            except (OSError, NodeDown, ValueError, KeyError):
                continue
            if g and g.get("is_leader") and (best is None or g["term"] > best[0]):
                best = (g["term"], nid)
        return best[1] if best else None

    def pid(self, nid: str) -> int | None:
        """The node's main process as the host sees it, or None while its container is stopped."""
        wrapped = self.containers[nid].get_wrapped_container()
        wrapped.reload()
        return int(wrapped.attrs["State"]["Pid"]) or None

    def data_dir(self, nid: str) -> Path:
        """The node's data as stored: its volume, or under the power-loss file system the directory
        that holds it (read without going through FUSE)."""
        return self.mounts[nid].disk / "data" if self.power_loss_fs else self.volume(nid)

    def groups(self) -> list[str]:
        return ["meta", *(str(g) for g in range(self.queue_groups))]

    # -- faults -----------------------------------------------------------------------------------

    def _wrapped(self, nid: str) -> Any:
        return self.containers[nid].get_wrapped_container()

    def kill(self, nid: str) -> None:
        """SIGKILL the node (the container stops; its volume stays)."""
        self._urls.pop(nid, None)
        try:
            self._wrapped(nid).kill(signal="SIGKILL")
        except docker.errors.APIError as e:
            if "is not running" not in str(e):
                raise

    def restart(self, nid: str, listen_timeout_s: float = 30.0) -> None:
        """Start a stopped node again (same volume, same address, a new host port). Its address
        is published (``url``) once its HTTP server answers: until then docker's port proxy accepts
        connections and resets them, which a client could only record as an unknown outcome,
        while in truth the node was down and nothing was sent."""
        if self._status(nid) in ("running", "paused"):
            return
        self._wrapped(nid).start()
        self._refresh_url(nid)
        url = self._urls.pop(nid)
        deadline = time.monotonic() + listen_timeout_s
        while time.monotonic() < deadline and not _answers_http(url):
            time.sleep(0.1)
        self._urls[nid] = url

    def restart_all(self, nids: Iterable[str]) -> None:
        """``restart`` several nodes at once (they start in parallel)."""
        nids = list(nids)
        with ThreadPoolExecutor(max(1, len(nids))) as pool:
            list(pool.map(self.restart, nids))

    def power_loss(self, nids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Cut the power of these nodes at once: SIGKILL them all, then drop everything each
        never fsynced (and mount its file system again, empty of unsynced state). Returns each
        node's drop report; ``restart`` brings them back."""
        nids = list(nids)
        if not self.power_loss_fs:
            raise RuntimeError("this cluster runs without the power-loss file system")
        for nid in nids:
            self.kill(nid)
        for nid in nids:
            self._wrapped(nid).wait(timeout=30)  # dead: nothing more reaches its disk
        reports = {nid: self.mounts[nid].power_loss() for nid in nids}
        for nid in nids:
            self.mounts[nid].mount()
        return reports

    def pause(self, nid: str) -> None:
        self._wrapped(nid).pause()

    def unpause(self, nid: str) -> None:
        if self._status(nid) == "paused":
            self._wrapped(nid).unpause()

    def exec(self, nid: str, script: str) -> str:
        """Run a shell script in a running container; raises on a non-zero exit."""
        code, out = self._wrapped(nid).exec_run(["sh", "-c", script])
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        if code != 0:
            raise RuntimeError(f"{nid}: `{script}` exited {code}: {text.strip()}")
        return text

    def drop_from(self, grudge: dict[str, set[str]]) -> None:
        """Partition: node A drops every packet from each node in ``grudge[A]`` (make the grudge
        symmetric for a clean cut; clients on the host are never dropped)."""
        for nid, enemies in grudge.items():
            if enemies and self.running(nid):
                rules = " && ".join(f"iptables -A INPUT -s {self.ips[e]} -j DROP" for e in sorted(enemies))
                self.exec(nid, rules)

    def lose_packets(self, probability: float, nodes: Iterable[str] | None = None) -> None:
        """Drop a random share of the packets each node receives from its peers."""
        for nid in nodes or self.node_ids:
            if self.running(nid):
                drop = f"-m statistic --mode random --probability {probability} -j DROP"
                rules = " && ".join(
                    f"iptables -A INPUT -s {ip} {drop}" for other, ip in self.ips.items() if other != nid
                )
                self.exec(nid, rules)

    def heal_network(self, nodes: Iterable[str] | None = None) -> None:
        for nid in nodes or self.node_ids:
            if self.running(nid):
                self.exec(nid, "iptables -F INPUT")

    def set_clock_offset(self, nid: str, offset_s: int) -> None:
        """Move the node's wall clock by ``offset_s`` from the real one (libfaketime re-reads the file
        within a second)."""
        self._write_control(nid, "faketime", f"{offset_s:+d}\n")

    def fill_disk(self, nid: str) -> int:
        """Fill the node's volume to the last byte; returns the bytes taken."""
        if not self.disk_limited:
            raise RuntimeError("the volumes are not size-limited tmpfs mounts (run as root)")
        fd = os.open(self.volume(nid) / "disk-filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        taken = 0
        try:
            chunk = b"\0" * (1 << 20)
            while len(chunk) >= 512:  # 1 MiB writes until ENOSPC, then smaller ones for the rest
                try:
                    taken += os.write(fd, chunk)
                except OSError:
                    chunk = chunk[: len(chunk) // 2]
        finally:
            os.close(fd)
        return taken

    def free_disk(self, nid: str) -> None:
        (self.volume(nid) / "disk-filler").unlink(missing_ok=True)

    def set_checkpoint_fetch_fault(self, nid: str, mode: str | None) -> None:
        """Make the node's checkpoint fetches (snapshot installs) ``"fail"`` or ``"stall"`` (up to
        60 s each, until the mode changes), or (None) work again; the node reads the file before
        every fetch (``[faults] checkpoint_fetch_fault_file``)."""
        path = self.volume(nid) / CHECKPOINT_FAULT_FILE
        if mode is None:
            path.unlink(missing_ok=True)
        else:
            self._write_control(nid, CHECKPOINT_FAULT_FILE, mode + "\n")

    def compact(self, nid: str, group: str) -> None:
        """Make the node's replica of ``group`` take a snapshot and compact its journal now."""
        self._get_json(nid, f"/internal/groups/{group}/compact", secret=True, method="POST")

    def heal_all(self, on_error: Callable[[str, Exception], None] | None = None) -> None:
        """Undo every fault on every node: free disks, reset clocks, restart, unpause, flush iptables."""
        steps: list[Callable[[str], None]] = [
            self.free_disk,
            lambda nid: self.set_checkpoint_fetch_fault(nid, None),
            lambda nid: self.set_clock_offset(nid, 0),
            self.unpause,
            self.restart,
            lambda nid: self.heal_network([nid]),
        ]
        for nid in self.node_ids:
            for step in steps:
                try:
                    step(nid)
                except Exception as e:
                    if on_error:
                        on_error(nid, e)
                    else:
                        log.warning("heal %s: %s", nid, e)
