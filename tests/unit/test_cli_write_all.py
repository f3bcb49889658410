"""``write_all``: a buffered write interrupted by a signal returns having written part of the data
(seen with a Ctrl-C held while consume wrote to a full pipe); the rest must still be written."""

import io

from raftmq.cluster.cli.common import write_all


class ShortWrites(io.RawIOBase):
    """Takes at most 7 bytes per write, as an interrupted write to a pipe may."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        taken = bytes(b[:7])
        self.data += taken
        return len(taken)


def test_everything_is_written_across_short_writes() -> None:
    out = ShortWrites()
    data = b"".join(b'{"value":"m%d"}\n' % i for i in range(100))
    write_all(out, data)  # type: ignore[arg-type]
    assert bytes(out.data) == data


def test_nothing_to_write() -> None:
    out = ShortWrites()
    write_all(out, b"")  # type: ignore[arg-type]
    assert out.data == b""
