"""Talking to the brokers from a Spark driver or executor (stdlib HTTP, no Spark import).

Everything here is plain Python and pyarrow so it can be unit-tested without a SparkSession.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from raftmq.storage.columns import BATCH_ROWS
from raftmq.storage.segments import read_segment

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class RaftmqSourceError(Exception):
    """A read that cannot give the rows it promised (brokers unreachable, a damaged segment)."""


class DataLossError(RaftmqSourceError):
    """Requested offsets are no longer retained (``failOnDataLoss=true``)."""


def parse_brokers(raw: str | None) -> list[str]:
    if not raw:
        raise ValueError(
            "option 'brokers' is required: comma-separated node URLs, e.g. http://127.0.0.1:8081"
        )
    out = []
    for b in raw.split(","):
        b = b.strip().rstrip("/")
        if not b:
            continue
        out.append(b if "://" in b else "http://" + b)
    if not out:
        raise ValueError("option 'brokers' names no node")
    return out


@dataclass(frozen=True)
class Brokers:
    """Where the brokers are and how to reach them: node URLs, the API token when the cluster
    requires tokens (docs/security.md), and the CA file that signed the nodes' certificates for
    ``https`` URLs (the system's CAs without one). Picklable: executors get it with their split."""

    urls: tuple[str, ...]
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None

    @classmethod
    def from_options(cls, options: Any, env: Mapping[str, str] = os.environ) -> Brokers:
        """From the options ``brokers``, ``token`` and ``caFile`` (else ``RAFTMQ_TOKEN`` and
        ``RAFTMQ_CA_FILE``, read where the query is planned)."""
        token = options.get("token") or env.get("RAFTMQ_TOKEN") or None
        ca_file = options.get("caFile") or env.get("RAFTMQ_CA_FILE") or None
        if ca_file is not None and not os.path.isfile(ca_file):
            raise ValueError(f"option 'caFile': no such file {ca_file!r}")
        return cls(tuple(parse_brokers(options.get("brokers"))), token, ca_file)


class BrokerClient:
    """HTTP/1.1 keep-alive requests to a list of brokers, trying the next one on a connection error."""

    def __init__(self, brokers: Brokers, timeout_s: float = 60.0) -> None:
        self.brokers = list(brokers.urls)
        self.timeout_s = timeout_s
        self._auth = {"Authorization": f"Bearer {brokers.token}"} if brokers.token else {}
        self._ssl = ssl.create_default_context(cafile=brokers.ca_file)
        self._conns: dict[str, http.client.HTTPConnection] = {}

    def _conn(self, base: str) -> http.client.HTTPConnection:
        conn = self._conns.get(base)
        if conn is None:
            u = urllib.parse.urlsplit(base)
            host = u.hostname or "127.0.0.1"
            if u.scheme == "https":
                conn = http.client.HTTPSConnection(
                    host, u.port or 443, timeout=self.timeout_s, context=self._ssl
                )
            else:
                conn = http.client.HTTPConnection(host, u.port or 80, timeout=self.timeout_s)
            self._conns[base] = conn
        return conn

    def request(
        self,
        path: str,
        *,
        prefer: str | None = None,
        headers: dict[str, str] | None = None,
        method: str = "GET",
        body: bytes | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """``(status, body, headers)`` from the first broker that answers (``prefer`` first)."""
        order = ([prefer] if prefer else []) + [b for b in self.brokers if b != prefer]
        errors = []
        for attempt in range(3):
            for base in order:
                for fresh in (False, True):
                    if fresh:
                        self.close(base)
                    try:
                        conn = self._conn(base)
                        conn.request(method, path, body=body, headers={**(headers or {}), **self._auth})
                        resp = conn.getresponse()
                        data = resp.read()
                        return resp.status, data, {k.lower(): v for k, v in resp.getheaders()}
                    except (OSError, http.client.HTTPException) as e:
                        self.close(base)
                        if fresh:
                            errors.append(f"{base}: {e}")
            time.sleep(0.5 * (attempt + 1))
        raise RaftmqSourceError(f"no broker answered {method} {path}: {errors[-3:]}")

    def get_json(self, path: str, prefer: str | None = None) -> Any:
        status, data, _ = self.request(path, prefer=prefer)
        if status != 200:
            raise RaftmqSourceError(f"GET {path}: HTTP {status}: {data[:500]!r}")
        return json.loads(data)

    def close(self, base: str | None = None) -> None:
        for b in [base] if base else list(self._conns):
            conn = self._conns.pop(b, None) if b else None
            if conn is not None:
                conn.close()


def manifest(client: BrokerClient, topic: str) -> dict[str, Any]:
    """The topic's segment manifest (``GET /v1/topics/{topic}/segments``)."""
    status, data, _ = client.request(f"/v1/topics/{urllib.parse.quote(topic, safe='')}/segments")
    if status == 404:
        raise RaftmqSourceError(f"topic {topic!r} does not exist: {data[:300]!r}")
    if status != 200:
        raise RaftmqSourceError(f"manifest of {topic!r}: HTTP {status}: {data[:300]!r}")
    result: dict[str, Any] = json.loads(data)
    return result


# -- planning --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, end)`` of one queue, read from a sealed segment or through the Arrow fetch."""

    start: int
    end: int
    segment: dict[str, Any] | None = None  # the manifest's segment entry


@dataclass
class Split:
    """The work of one Spark task: consecutive pieces of one queue."""

    topic: str
    queue: int
    pieces: list[Piece] = field(default_factory=list)
    leader_url: str | None = None

    @property
    def rows(self) -> int:
        return sum(p.end - p.start for p in self.pieces)


def check_start(topic: str, queue: int, start: int, low: int, high: int, fail_on_data_loss: bool) -> int:
    """``start`` itself, or ``low`` when retention removed it and data loss is accepted.

    Raises:
        DataLossError: ``start < low`` and ``fail_on_data_loss``.
    """
    if start < low:
        if fail_on_data_loss:
            raise DataLossError(
                f"raftmq: offsets [{start}, {low}) of queue {queue} of topic {topic!r} are no longer "
                f"retained (the queue starts at {low} now; retention removed them). Some data may have "
                "been lost. Set failOnDataLoss=false to read from the earliest retained offset instead."
            )
        return low
    return min(start, high)


def plan_queue(
    topic: str, info: dict[str, Any], start: int, end: int, max_rows_per_split: int, tail_rows_per_split: int
) -> list[Split]:
    """Splits covering ``[start, end)`` of one queue: sealed segments where they cover the range,
    the Arrow fetch for the rest (the unsealed committed tail)."""
    queue = info["queue"]
    pieces: list[Piece] = []
    pos = start
    for s in info["segments"]:
        if pos >= end:
            break
        if s["end"] <= pos:
            continue
        if s["base"] > pos:  # not covered by a segment: fetch up to it
            stop = min(s["base"], end)
            pieces.append(Piece(pos, stop))
            pos = stop
            if pos >= end:
                break
        stop = min(s["end"], end)
        pieces.append(Piece(pos, stop, s))
        pos = stop
    if pos < end:
        pieces.append(Piece(pos, end))
    splits: list[Split] = []
    leader_url = info.get("leader_url")
    for p in pieces:
        limit = max_rows_per_split if p.segment is not None else tail_rows_per_split
        if p.segment is None:  # tail: cut into chunks of at most `limit` rows
            s0 = p.start
            while s0 < p.end:
                s1 = min(p.end, s0 + limit)
                splits.append(Split(topic, queue, [Piece(s0, s1)], leader_url))
                s0 = s1
            continue
        last = splits[-1] if splits else None
        if (
            last is not None
            and last.pieces[-1].segment is not None
            and last.rows + (p.end - p.start) <= limit
        ):
            last.pieces.append(p)  # small segments share a task
        else:
            splits.append(Split(topic, queue, [p], leader_url))
    return splits


def split_further(splits: list[Split], min_partitions: int) -> list[Split]:
    """Cut the largest splits in two until there are ``min_partitions`` (Kafka's minPartitions)."""
    splits = list(splits)
    while len(splits) < min_partitions:
        splits.sort(key=lambda s: -s.rows)
        big = splits[0]
        if big.rows < 2:
            break
        half = big.rows // 2
        left: list[Piece] = []
        right: list[Piece] = []
        taken = 0
        for p in big.pieces:
            n = p.end - p.start
            if taken >= half:
                right.append(p)
            elif taken + n <= half:
                left.append(p)
            else:
                cut = p.start + (half - taken)
                left.append(Piece(p.start, cut, p.segment))
                right.append(Piece(cut, p.end, p.segment))
            taken += n
        splits[0:1] = [
            Split(big.topic, big.queue, left, big.leader_url),
            Split(big.topic, big.queue, right, big.leader_url),
        ]
    splits.sort(key=lambda s: (s.topic, s.queue, s.pieces[0].start if s.pieces else 0))
    return splits


def rate_limit(
    start: dict[str, dict[str, int]], end: dict[str, dict[str, int]], max_rows: int
) -> dict[str, dict[str, int]]:
    """``end`` cut so that at most ``max_rows`` rows are read in total, shared in proportion to
    what each queue has (Kafka's maxOffsetsPerTrigger), deterministically."""
    avail = {(t, q): max(0, e - start.get(t, {}).get(q, e)) for t, qs in end.items() for q, e in qs.items()}
    total = sum(avail.values())
    if total <= max_rows:
        return end
    give = {k: (v * max_rows) // total for k, v in avail.items()}
    left = max_rows - sum(give.values())
    for k in sorted(avail, key=lambda k: (-(avail[k] - give[k]), k)):
        if left <= 0:
            break
        if give[k] < avail[k]:
            give[k] += 1
            left -= 1
    return {
        t: {q: start.get(t, {}).get(q, e) + give[(t, q)] if (t, q) in give else e for q, e in qs.items()}
        for t, qs in end.items()
    }


# -- reading (executors) ---------------------------------------------------------------------------


def _segment_bytes(client: BrokerClient, seg: dict[str, Any], verify: bool) -> pa.Buffer | None:
    """The segment's Arrow file: memory-mapped from its path when this machine sees it, else over
    HTTP from the node that wrote it (or any broker). None when the segment is gone."""
    path = seg.get("arrow_path")
    if path and "://" not in path and os.path.exists(path):
        try:
            buf = pa.memory_map(path).read_buffer()
            if not verify:
                return buf
            from crc32c import crc32c

            if crc32c(buf) == seg["crc32c"]:
                return buf
        except OSError:
            pass
    elif path and "://" in path:
        try:
            import pyarrow.fs as pafs

            fs, p = pafs.FileSystem.from_uri(path)
            with fs.open_input_file(p) as f:
                return f.read_buffer()
        except (OSError, pa.ArrowException):
            pass
    url = urllib.parse.urlsplit(seg["url"])
    prefer = f"{url.scheme}://{url.netloc}"
    status, data, _ = client.request(url.path + "?format=arrow", prefer=prefer)
    if status == 200:
        return pa.py_buffer(data)
    if status in (404, 503):  # gone (retention), or its writer is down: the log still has the rows
        return None
    raise RaftmqSourceError(f"segment {seg['url']}: HTTP {status}: {data[:300]!r}")


def fetch_range(
    client: BrokerClient,
    topic: str,
    queue: int,
    start: int,
    end: int,
    fail_on_data_loss: bool,
    prefer: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows ``[start, end)`` through the Arrow fetch (65,536 rows a call)."""
    pos = start
    path = f"/v1/topics/{urllib.parse.quote(topic, safe='')}/queues/{queue}/messages"
    empty = 0
    while pos < end:
        status, data, _headers = client.request(
            f"{path}?offset={pos}&max={min(BATCH_ROWS, end - pos)}",
            prefer=prefer,
            headers={"Accept": ARROW_STREAM},
        )
        if status == 416:
            low = json.loads(data)["error"]["low_offset"]
            if pos >= low:
                raise RaftmqSourceError(f"queue {queue} of {topic!r} has no offset {pos}: {data[:300]!r}")
            pos = check_start(topic, queue, pos, low, max(end, low), fail_on_data_loss)
            continue
        if status != 200:
            raise RaftmqSourceError(f"fetch {topic}/{queue}@{pos}: HTTP {status}: {data[:300]!r}")
        got = 0
        for batch in ipc.open_stream(data):
            if batch.num_rows and pos + batch.num_rows > end:
                batch = batch.slice(0, end - pos)
            got += batch.num_rows
            pos += batch.num_rows
            if batch.num_rows:
                yield batch
        if got == 0:
            empty += 1
            if empty > 20:
                raise RaftmqSourceError(f"queue {queue} of {topic!r} returned nothing at {pos} below {end}")
            time.sleep(0.1)


def read_split(
    split: Split, brokers: Brokers, fail_on_data_loss: bool, verify: bool = True
) -> Iterator[pa.RecordBatch]:
    """Every row of ``split`` in offset order, as record batches of the full segment schema."""
    client = BrokerClient(brokers)
    try:
        for p in split.pieces:
            if p.segment is None:
                yield from fetch_range(
                    client, split.topic, split.queue, p.start, p.end, fail_on_data_loss, split.leader_url
                )
                continue
            seg = p.segment
            buf = _segment_bytes(client, seg, verify)
            if buf is None:  # unreachable or pruned: the fetch reads the rows from the log, if retained
                yield from fetch_range(
                    client, split.topic, split.queue, p.start, p.end, fail_on_data_loss, split.leader_url
                )
                continue
            yield from read_segment(
                buf, p.start, p.end, seg["base"], seg["crc32c"] if verify else None, what=seg["url"]
            )
    finally:
        client.close()


def offset_for_timestamp(
    client: BrokerClient, topic: str, info: dict[str, Any], ts_ms: int, verify: bool = True
) -> int:
    """The first offset of a queue whose timestamp is at least ``ts_ms`` (its ``high_offset`` if
    none is). Assumes timestamps grow with offsets, as the leaders stamp them."""
    low, high = int(info["low_offset"]), int(info["high_offset"])
    target = ts_ms * 1000
    pos = low
    for s in info["segments"]:
        if s["last_timestamp_ms"] < ts_ms:
            pos = max(pos, s["end"])
            continue
        if s["first_timestamp_ms"] >= ts_ms:
            return max(int(s["base"]), low)
        buf = _segment_bytes(client, s, verify)
        if buf is not None:
            for batch in read_segment(buf, max(s["base"], low), s["end"], s["base"], None):
                found = _first_at_least(batch, target)
                if found is not None:
                    return found
        pos = max(pos, s["end"])
    for batch in fetch_range(client, topic, info["queue"], pos, high, False, info.get("leader_url")):
        found = _first_at_least(batch, target)
        if found is not None:
            return found
    return high


def _first_at_least(batch: pa.RecordBatch, target_us: int) -> int | None:
    import pyarrow.compute as pc

    ts = batch.column(5).cast(pa.int64())
    mask = pc.greater_equal(ts, target_us)
    idx = pc.index(mask, True).as_py()
    if idx is None or idx < 0:
        return None
    return int(batch.column(4)[idx].as_py())
