"""The client's lower layer, public for tools that speak the HTTP API themselves: the chaos suite's
workload (``chaos/client.py``) and ``raftmq receive`` / ``raftmq dlq`` (``cluster/cli/delivery.py``).

- :class:`Transport`: HTTP to the nodes (aiohttp), one session, node addresses and failover;
- :class:`ApiClient`: the API calls over a transport, with retries of what is safe to retry;
- :class:`Backoff`: the retry delays (exponential, capped, with jitter);
- :func:`path_part`: a topic or group name quoted for a URL path;
- :func:`get_batches` / :class:`Batches`: a binary fetch (``Accept: application/vnd.raftmq.batch``)
  and its answer: the stored record batches, checked, and the positions.

Applications use the package's high-level API (``raftmq.client``: producers, consumers,
subscribers, admin), which is built on these.
"""

from __future__ import annotations

from ._api import ApiClient
from ._batches import Batches, get_batches
from ._retry import Backoff
from ._transport import Transport, path_part

__all__ = ["ApiClient", "Backoff", "Batches", "Transport", "get_batches", "path_part"]
