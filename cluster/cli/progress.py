"""Progress and final summaries of ``raftmq produce``, ``consume`` and ``receive`` (cli/messages.py).

The three commands behave alike:

- a live progress line on stderr (messages so far and messages/s) when stderr is a terminal, the
  messages printed (consume, receive) do not go to that same terminal, and neither ``--quiet`` nor
  ``--json`` is given;
- one summary line on stderr at the end, with the command's elapsed time (from the process's
  start, as ``time`` counts it: the interpreter's start and imports take 0.5-1 s) and the rate
  over it; ``--json`` prints it as one JSON object instead, ``--quiet``
  leaves it out. Errors are printed in every case.

The bytes counted (MB, MB/s, ``bytes``) are the messages' values, as produced and as stored
(binary values decoded, text values as UTF-8): the same figure for the same messages whichever
command counts them, not the input lines nor the JSON lines printed (keys, headers, offsets).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import click

__all__ = ["Tally", "output_options", "per_second", "plural", "progress", "summary", "value_bytes"]


def plural(count: int, word: str = "message") -> str:
    """``1 message``, ``2 messages``, ``1,000 messages``."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def per_second(rate: float, word: str = "message") -> str:
    """``1 message/s``, ``2,400 messages/s`` (rounded to a whole number first)."""
    return f"{rate:,.0f} {word}{'' if round(rate) == 1 else 's'}/s"


def value_bytes(value: str | bytes) -> int:
    """The size of a message's value as stored: text as UTF-8."""
    return len(value) if isinstance(value, bytes) else len(value.encode())


def process_started() -> float:
    """When this process started, on the ``time.monotonic`` clock (Linux: ``/proc/self/stat``'s
    start time in clock ticks since boot, 10 ms steps); now where that cannot be read."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0.0 <= age < 600.0 else now


@dataclass
class Tally:
    """What a command has done so far (read by the progress line from its refresh thread)."""

    verb: str  # produced, consumed, received
    count: int = 0
    size: int = 0
    started: float = field(default_factory=process_started)
    ended: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, count: int, size: int) -> None:
        with self.lock:
            self.count += count
            self.size += size

    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started


def output_options(f: Any) -> Any:
    """``--quiet/-q`` and ``--json`` (the same on produce, consume and receive)."""
    f = click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print the final summary on stderr as one JSON object (and no progress line).",
    )(f)
    return click.option(
        "--quiet", "-q", is_flag=True, help="No progress line and no summary (errors are still printed)."
    )(f)


def _is_tty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def wants_progress(quiet: bool, as_json: bool, output: IO[bytes] | None = None) -> bool:
    """A progress line: stderr is a terminal, not shared with the messages written to ``output``."""
    if quiet or as_json or not _is_tty(sys.stderr):
        return False
    return output is None or not _is_tty(output)


class _Rate:
    """Messages/s over the last few seconds (samples taken as the line is drawn)."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def __call__(self, now: float, count: int) -> float:
        self.samples.append((now, count))
        while len(self.samples) > 2 and now - self.samples[0][0] > 3.0:
            self.samples.popleft()
        first_at, first = self.samples[0]
        return (count - first) / (now - first_at) if now > first_at else 0.0


@contextlib.contextmanager
def progress(tally: Tally, what: str, enabled: bool, extra: Any = None) -> Iterator[None]:
    """While entered, a live line on stderr: ``what``, the messages so far, messages/s and the
    elapsed time (redrawn 4 times a second from the tally, also while the command waits)."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    rate = _Rate()

    class _Line:
        def __rich__(self) -> Text:
            now = time.monotonic()
            count = tally.count
            more = f" {extra()}" if extra is not None else ""
            return Text(
                f"{what}: {plural(count)} {tally.verb}{more}, {per_second(rate(now, count))}, "
                f"{now - tally.started:,.1f} s",
                no_wrap=True,
                overflow="ellipsis",
            )

    with Live(_Line(), console=Console(stderr=True), refresh_per_second=4, transient=True):
        yield


def summary(tally: Tally, *, quiet: bool, as_json: bool, **more: Any) -> None:
    """The final line on stderr (see the module docstring)."""
    if tally.ended is None:
        tally.ended = time.monotonic()
    if quiet:
        return
    seconds = max(tally.seconds(), 1e-9)
    if as_json:
        body = {
            tally.verb: tally.count,
            "bytes": tally.size,
            "seconds": round(seconds, 3),
            "messages_per_s": round(tally.count / seconds, 1),
            **more,
        }
        click.echo(json.dumps(body, separators=(",", ":")), err=True)
        return
    click.echo(
        f"{tally.verb} {plural(tally.count)} ({tally.size / 1e6:,.2f} MB) in {seconds:,.2f} s: "
        f"{per_second(tally.count / seconds)}, {tally.size / 1e6 / seconds:,.2f} MB/s",
        err=True,
    )
