"""The power-loss file system: :class:`~raftmq.chaos.lossy_disk.LossyDisk` mounted with FUSE.

One daemon per node runs on the host (``python -m raftmq.chaos.powerloss_fs``), mounts a FUSE file
system (libfuse3 through ``mfusepy``) over the node's data directory, which the node's container
bind-mounts as ``/data``, and answers on a Unix socket beside it:

- ``pending``: what a power loss would drop now (JSON);
- ``power-loss``: cut the power: every file operation fails from now on, the backing directory goes
  back to what was fsynced (:meth:`LossyDisk.power_loss`), the answer is the drop report (JSON),
  and the daemon unmounts and exits. The node must be dead first (``kill -9``); the harness then
  mounts a new daemon before it starts the node again, so nothing of the old mount (the kernel's
  page cache of it included) survives.

:class:`LossyMount` is the harness's side: start the daemon, ask it, stop it.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .lossy_disk import LossyDisk

__all__ = ["LossyMount", "main"]

log = logging.getLogger("raftmq.chaos.powerloss_fs")

_STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")


def _operations(disk: LossyDisk) -> Any:
    import mfusepy  # only the daemon needs libfuse

    class Operations(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = disk.stat(path)
            attrs: dict[str, Any] = {k: getattr(st, k) for k in _STAT_KEYS}
            attrs |= {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}
            return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *disk.passthrough(os.listdir, path)]

        def readlink(self, path: str) -> str:
            return str(disk.passthrough(os.readlink, path))

        def statfs(self, path: str) -> dict[str, int]:
            st = disk.passthrough(os.statvfs, path)
            keys = (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_namemax",
            )
            return {k: getattr(st, k) for k in keys}

        def chmod(self, path: str, mode: int) -> int:
            disk.passthrough(os.chmod, path, mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            disk.passthrough(os.lchown, path, uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                disk.passthrough(os.utime, path)
            else:
                disk.passthrough(lambda p, t: os.utime(p, ns=t, follow_symlinks=False), path, times)
            return 0

        def access(self, path: str, amode: int) -> int:
            if not disk.passthrough(os.access, path, amode):
                raise OSError(errno.EACCES, "access")
            return 0

        def open(self, path: str, flags: int) -> int:
            return disk.open(path, flags)

        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            return disk.open(path, flags | os.O_CREAT, mode)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return disk.read(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return disk.write(fh, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            disk.truncate(path, length)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            disk.close(fh)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            disk.fsync(fh)
            return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            disk.fsync_dir(path)
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            disk.mkdir(path, mode)
            return 0

        def rmdir(self, path: str) -> int:
            disk.rmdir(path)
            return 0

        def unlink(self, path: str) -> int:
            disk.unlink(path)
            return 0

        def rename(self, old: str, new: str) -> int:
            disk.rename(old, new)
            return 0

        def link(self, target: str, source: str) -> int:
            disk.link(target, source)  # mfusepy: target is the new name, source the existing file
            return 0

        def symlink(self, target: str, source: str) -> int:
            disk.symlink(target, source)  # target is the new link, source what it points to
            return 0

    return Operations()


def _serve_control(disk: LossyDisk, sock_path: str, mountpoint: str) -> None:
    """Answer control commands, one line each, until a power loss."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(4)
    while True:
        conn, _ = server.accept()
        with conn:
            command = conn.makefile("r").readline().strip()
            if command == "pending":
                conn.sendall(json.dumps(disk.pending()).encode() + b"\n")
            elif command == "power-loss":
                answer: dict[str, Any]
                try:
                    answer = dict(disk.power_loss().as_json())
                except Exception as e:  # the harness must hear why, and the log must show where
                    log.exception("power_loss_failed")
                    answer = {"error": f"{type(e).__name__}: {e}"}
                conn.sendall(json.dumps(answer).encode() + b"\n")
                break
            else:
                conn.sendall(json.dumps({"error": f"unknown command {command!r}"}).encode() + b"\n")
    server.close()
    os.unlink(sock_path)
    # The loop of the FUSE session ends when the kernel lets go of the mount.
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="powerloss_fs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the backing directory (the durable state)")
    parser.add_argument("--trash", required=True, help="a directory on the same file system as --data")
    parser.add_argument("--mount", required=True, help="where to mount")
    parser.add_argument("--control", required=True, help="the control socket's path")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import mfusepy

    disk = LossyDisk(args.data, args.trash)
    if os.path.exists(args.control):
        os.unlink(args.control)
    threading.Thread(target=_serve_control, args=(disk, args.control, args.mount), daemon=True).start()
    mfusepy.FUSE(_operations(disk), args.mount, foreground=True, fsname="raftmq-powerloss")
    return 0


class LossyMount:
    """The harness's handle on one daemon. ``disk`` holds ``data`` (the durable state) and ``trash``;
    ``mountpoint`` is what the node sees."""

    def __init__(self, disk: Path, mountpoint: Path, log_path: Path | None = None) -> None:
        self.disk = disk
        self.mountpoint = mountpoint
        self.control = disk / "control.sock"
        self.log_path = log_path or disk.parent / f"{mountpoint.name}.powerloss.log"
        self.process: subprocess.Popen[bytes] | None = None

    def mount(self, timeout_s: float = 10.0) -> None:
        (self.disk / "data").mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "raftmq.chaos.powerloss_fs",
                    "--data",
                    str(self.disk / "data"),
                    "--trash",
                    str(self.disk / "trash"),
                    "--mount",
                    str(self.mountpoint),
                    "--control",
                    str(self.control),
                ],
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout_s
        while not (self.mounted() and self.control.exists()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the power-loss file system did not mount; see {self.log_path}")
            time.sleep(0.02)

    def mounted(self) -> bool:
        return os.path.ismount(self.mountpoint)

    def _ask(self, command: str, timeout_s: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(self.control))
            s.sendall(command.encode() + b"\n")
            answer: dict[str, Any] = json.loads(s.makefile("r").readline())
            return answer

    def pending(self) -> dict[str, Any]:
        return self._ask("pending")

    def power_loss(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Drop everything never fsynced and unmount; returns the drop report. Kill the node first."""
        report = self._ask("power-loss")
        self._wait_gone(timeout_s)
        if "error" in report:
            raise RuntimeError(f"the power loss failed: {report['error']}; see {self.log_path}")
        return report

    def unmount(self, timeout_s: float = 10.0) -> None:
        """Unmount keeping everything (a clean shutdown: the end of a run)."""
        if self.mounted():
            subprocess.run(
                ["fusermount3", "-u", "-z", str(self.mountpoint)], check=False, capture_output=True
            )
        self._wait_gone(timeout_s)

    def _wait_gone(self, timeout_s: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


if __name__ == "__main__":
    sys.exit(main())
