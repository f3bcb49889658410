"""The checkpoint route's sending side (``internal.send_checkpoint``) over a real aiohttp server and
client, with the real error middleware: a receiver that goes away mid-archive leaves no checkpoint
behind on the sender, and a failure once the answer has begun cuts the body short (the client's
read fails) instead of writing an error answer into it."""

from __future__ import annotations

import asyncio
import logging
import os
import tarfile
import urllib.request
from collections.abc import Generator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from raftmq.cluster.api.common import error_middleware
from raftmq.cluster.api.handlers.internal import send_checkpoint
from raftmq.cluster.node import checkpoints
from raftmq.cluster.node.checkpoints import CheckpointStream


def _checkpoint(tmp_path: Path, files: int = 8) -> str:
    ckpt = tmp_path / "tmp" / "ckpt-0-1"
    ckpt.mkdir(parents=True)
    for i in range(files):
        (ckpt / f"{i:06d}.sst").write_bytes(os.urandom(1 << 20))
    (tmp_path / "tmp" / "ckpt-0-1.json").write_bytes(b'{"group": "0"}')
    return str(ckpt)


class Failing(CheckpointStream):
    """Fails after its first chunk (a disk error while the archive is read)."""

    def chunks(self) -> Generator[bytes, None, None]:
        inner = super().chunks()
        yield next(inner)
        inner.close()
        raise OSError("disk gone")


async def _serve(stream: CheckpointStream, timeout_s: float = 5.0) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await send_checkpoint(request, "0", stream, timeout_s)

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/c", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/c"


async def _wait_gone(path: str) -> None:
    for _ in range(200):
        if not os.path.exists(path) and not os.path.exists(path + ".json"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} still there")


def test_a_whole_archive_is_sent_and_the_checkpoint_deleted(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, files=3)

    async def run() -> int:
        runner, url = await _serve(CheckpointStream(ckpt))
        try:
            async with aiohttp.ClientSession() as s, s.get(url) as r:
                assert r.status == 200 and r.headers.get("Transfer-Encoding") == "chunked"
                body = await r.read()
            await _wait_gone(ckpt)
            return len(body)
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) > 3 << 20


def test_a_receiver_gone_mid_archive_leaves_no_checkpoint_and_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver that goes away (it gave up, or had all it needed: a reader of the archive closes
    at its end, before the chunked body's) is no server error: no traceback in the node's log
    (the chaos suite counts them), and the checkpoint is deleted."""
    ckpt = _checkpoint(tmp_path)

    async def run() -> None:
        runner, url = await _serve(CheckpointStream(ckpt))
        try:
            async with aiohttp.ClientSession() as s:
                r = await s.get(url)
                await r.content.readexactly(1 << 20)
                r.close()  # the connection dropped with most of the archive unread
            await _wait_gone(ckpt)
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.INFO):
        asyncio.run(run())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_a_failure_after_the_answer_began_cuts_the_body_short(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)

    async def run() -> bytes:
        runner, url = await _serve(Failing(ckpt))
        try:
            host, port = url.split("//")[1].split("/")[0].split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
            raw = await asyncio.wait_for(reader.read(), 30)  # to the connection's end
            writer.close()
            await _wait_gone(ckpt)
            return raw
        finally:
            await runner.cleanup()

    raw = asyncio.run(run())
    assert raw.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in raw
    assert raw.count(b"HTTP/1.1 ") == 1  # no error answer written into the body
    assert not raw.endswith(b"0\r\n\r\n")  # no end of the chunked body: the read fails
    assert len(raw) > 1 << 20  # the first chunk went out


def test_a_download_as_a_replica_makes_it_takes_the_whole_body(tmp_path: Path) -> None:
    """The replica's download (urllib, the archive read as a stream, then the rest of the body):
    the files arrive and the sender ends without error."""
    ckpt = _checkpoint(tmp_path, files=3)
    dest = tmp_path / "incoming"

    async def run() -> None:
        runner, url = await _serve(CheckpointStream(ckpt))
        try:

            def download() -> None:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    with tarfile.open(fileobj=resp, mode="r|") as tar:
                        checkpoints._safe_extract(tar, str(dest))
                    checkpoints._read_to_the_end(resp)

            await asyncio.get_running_loop().run_in_executor(None, download)
            await _wait_gone(ckpt)
        finally:
            await runner.cleanup()

    asyncio.run(run())
    assert sorted(p.name for p in (dest / "checkpoint").iterdir()) == [f"{i:06d}.sst" for i in range(3)]
    assert (dest / "meta.json").read_bytes() == b'{"group": "0"}'
