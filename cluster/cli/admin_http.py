"""A tiny synchronous HTTP client for the CLI's admin commands (stdlib ``urllib`` only).

Errors::

    AdminError              anything the CLI reports as one line
    ├── ServerError         a node answered with an error body (``code`` as in the API)
    └── NoAnswer            no node answered (or the answer to a write was lost)

Failover: the base URLs are tried in order and the first that answers is used. A request moves on
to the next URL only when it certainly did not reach the previous one (the connection failed), so a
write is never sent twice; a write whose answer is lost is reported as such, never retried.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from raftmq.cluster.config.keys import NO_REDIRECTS
from raftmq.errors import RaftmqError

__all__ = ["DEFAULT_URL", "AdminError", "AdminHttp", "NoAnswer", "ServerError", "normalize_url"]

DEFAULT_URL = "http://127.0.0.1:8081"


class AdminError(RaftmqError):
    """A failed admin request; ``str(e)`` is one line for the user."""


class ServerError(AdminError):
    """A node answered with an error: ``code`` is the API's stable error code."""

    def __init__(self, code: str, message: str, status: int, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.details = details or {}  # the error body's other fields (e.g. index, limit)


class NoAnswer(AdminError):
    """No node answered; ``definite`` is False when a write may have happened anyway."""

    def __init__(self, message: str, definite: bool = True) -> None:
        super().__init__(message)
        self.definite = definite


def normalize_url(url: str) -> str:
    """``127.0.0.1:8081`` and ``http://127.0.0.1:8081/`` both become ``http://127.0.0.1:8081``."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException):
        return _reason(e.reason)
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


def _server_error(status: int, data: bytes) -> ServerError:
    try:
        e = json.loads(data)["error"]
        details = {k: v for k, v in e.items() if k not in ("code", "message", "retriable", "definite")}
        return ServerError(str(e["code"]), str(e.get("message", "")), status, details)
    except (ValueError, KeyError, TypeError):
        text = data.decode(errors="replace").strip().splitlines()
        return ServerError(f"http_{status}", text[0][:200] if text else "no error body", status)


class AdminHttp:
    """JSON requests to the first of ``urls`` that answers.

    Args:
        urls: Base URLs of nodes (any node answers any request), tried in order.
        timeout_s: Socket timeout of one attempt (connect, and each read).
        token: API token, sent as ``Authorization: Bearer <token>``.
        ca_file: CA certificates that ``https://`` nodes are verified against (default: the
            system's CAs).
    """

    def __init__(
        self,
        urls: Sequence[str],
        timeout_s: float = 10.0,
        *,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one URL is needed")
        self.urls = [normalize_url(u) for u in urls]
        self.timeout_s = timeout_s
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        # No redirects: urllib would send the Authorization header on to wherever a Location points.
        self._opener = urllib.request.build_opener(
            NO_REDIRECTS, urllib.request.HTTPSHandler(context=self._context)
        )

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer of a 2xx response.

        Raises:
            ServerError: a node answered with an error status.
            NoAnswer: no URL could be reached, or a write's answer was lost.
        """
        data = None if body is None else json.dumps(body).encode()
        failures: list[str] = []
        for base in self.urls:
            req = urllib.request.Request(
                base + path,
                data=data,
                method=method,
                headers={"Content-Type": "application/json", "Accept": "application/json", **self._auth},
            )
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as e:
                raise _server_error(e.code, e.read()) from None
            except urllib.error.URLError as e:
                # Raised while connecting or sending: the request did not reach this node.
                failures.append(f"{base} ({_reason(e)})")
                continue
            except (OSError, http.client.HTTPException) as e:
                # The request was sent and the answer was lost: only a read may go elsewhere.
                if method != "GET":
                    raise NoAnswer(
                        f"no answer from {base} ({_reason(e)}); the {method} {path} may or may not "
                        "have taken effect",
                        definite=False,
                    ) from None
                failures.append(f"{base} ({_reason(e)})")
                continue
            except ValueError as e:  # urllib's word for a malformed URL
                failures.append(f"{base} ({e})")
                continue
            try:
                return json.loads(raw or b"null")
            except ValueError:
                raise NoAnswer(f"{base} answered with something other than JSON") from None
        raise NoAnswer("no raftmq node answered: " + ", ".join(failures))

    @staticmethod
    def quote(segment: str) -> str:
        """A path segment, percent-encoded."""
        return urllib.parse.quote(segment, safe="")
