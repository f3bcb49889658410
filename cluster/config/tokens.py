"""API tokens and their per-topic permissions (pure: no I/O; ``cluster/api/auth.py`` enforces them).

The cluster file lists tokens under ``[security]``::

    [security]
    metrics_open = false                 # true: GET /metrics needs no token
    allow_unauthenticated = false        # true: no tokens and a non-loopback HTTP address is fine

    [[security.tokens]]
    name = "orders-service"
    sha256 = "<64 hex digits>"           # SHA-256 of the token: the file holds no secret
    # token = "<the token itself>"       # or the token (at least 16 characters)
    produce = ["orders.*"]               # shell-style patterns of topic names
    consume = ["orders.*", "audit"]
    admin = []                           # ["*"] also allows the cluster-wide admin routes
    metrics = false                      # true: GET /metrics shows every topic (a scraper's token)

``RAFTMQ_TOKEN_<NAME>`` (the name upper-cased, ``-`` and ``.`` as ``_``) sets the token of the entry
named NAME from the environment (it replaces ``sha256``/``token`` of the file). Authentication is on
as soon as one token is listed.

Invariant: a grant keeps only the SHA-256 digest of its token; the token itself never leaves
:func:`parse_security`, so no repr, log line or error message can show it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from raftmq.errors import RaftmqError

__all__ = [
    "ADMIN",
    "CONSUME",
    "MAX_TOKEN_CHARS",
    "PERMISSIONS",
    "PRODUCE",
    "BadCredentials",
    "SecurityConfig",
    "TokenGrant",
    "bearer_token",
    "parse_security",
    "token_digest",
]

PRODUCE, CONSUME, ADMIN = "produce", "consume", "admin"
PERMISSIONS = (PRODUCE, CONSUME, ADMIN)
MAX_TOKEN_CHARS = 4096
MIN_TOKEN_CHARS = 16
# RFC 6750 b64token: what a Bearer credential may consist of.
_B64TOKEN = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# A topic pattern: topic-name characters plus fnmatch's * ? [ ] !
_PATTERN = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]{1,200}$")
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def token_digest(token: str) -> bytes:
    """The SHA-256 digest a grant stores for ``token``."""
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class TokenGrant:
    """One API token: its name (for logs), the digest of its secret, and what it may do."""

    name: str
    digest: bytes = field(repr=False)
    produce: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    admin: tuple[str, ...] = ()
    # GET /metrics in full (every topic's and group's names, Raft addresses); without it (and
    # without cluster admin) only the topics the token has some right on (api/visibility.py).
    metrics: bool = False
    # Where the secret came from: "env" (its RAFTMQ_TOKEN_* variable), "token" or "sha256" (the
    # file's key). Never the secret: ``raftmq dev``'s hint says where to find it (cli/dev_hints.py).
    source: str = "sha256"

    def allows(self, permission: str, topic: str | None) -> bool:
        """True if this token has ``permission`` on ``topic``; with ``topic=None``, on any topic
        (a request whose topic cannot be read is then refused by the handler, not here)."""
        patterns: tuple[str, ...] = getattr(self, permission)
        if topic is None:
            return bool(patterns)
        return any(fnmatchcase(topic, p) for p in patterns)

    def allows_any(self, topic: str) -> bool:
        """Some permission on ``topic`` (enough to see it described or listed)."""
        return any(self.allows(p, topic) for p in PERMISSIONS)

    @property
    def cluster_admin(self) -> bool:
        """Admin over every topic (``admin = ["*"]``): also allows the routes without a topic."""
        return "*" in self.admin


@dataclass(frozen=True)
class SecurityConfig:
    tokens: tuple[TokenGrant, ...] = ()
    metrics_open: bool = False  # GET /metrics without a token
    # Without tokens, ``raftmq serve`` refuses a non-loopback HTTP address unless this is set
    # (``cluster/cli/serve.py``): an open API beyond one host must be asked for.
    allow_unauthenticated: bool = False

    @property
    def enabled(self) -> bool:
        """Authentication is on once any token is configured."""
        return bool(self.tokens)

    def authenticate(self, token: str) -> TokenGrant | None:
        """The grant whose digest matches ``token``'s. Every grant is compared (in constant time),
        so the time taken says nothing about which digest came close."""
        digest = token_digest(token)
        found = None
        for grant in self.tokens:
            if hmac.compare_digest(grant.digest, digest):
                found = grant
        return found


class BadCredentials(RaftmqError):
    """The Authorization header is missing or malformed; ``str(e)`` is a fixed phrase that never
    contains the header's value."""


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value.

    Raises:
        BadCredentials: no header, another scheme, or a credential that is not an RFC 6750 token
            of at most MAX_TOKEN_CHARS characters.
    """
    if header is None:
        raise BadCredentials("missing Authorization header; send 'Authorization: Bearer <token>'")
    if len(header) > MAX_TOKEN_CHARS + 7 or not header.isascii():
        raise BadCredentials("malformed Authorization header")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer":
        raise BadCredentials("the Authorization scheme must be Bearer")
    if not _B64TOKEN.match(token):
        raise BadCredentials("malformed bearer token")
    return token


def env_var(name: str) -> str:
    """The environment variable that sets the token named ``name``."""
    return "RAFTMQ_TOKEN_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def parse_security(raw: Any, env: Mapping[str, str], problems: list[str]) -> SecurityConfig:
    """The ``[security]`` table; problems are appended (never with a token's value in them)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append("[security] must be a table")
        return SecurityConfig()
    flags = ("metrics_open", "allow_unauthenticated")
    problems += [f"unknown key security.{k}" for k in sorted(set(raw) - {"tokens", *flags})]
    metrics_open, allow_unauthenticated = (_flag(raw, key, env, problems) for key in flags)
    entries = raw.get("tokens", [])
    if not isinstance(entries, list):
        problems.append("security.tokens must be an array of tables ([[security.tokens]])")
        entries = []
    grants: list[TokenGrant] = []
    for i, entry in enumerate(entries):
        grant = _parse_grant(i, entry, env, problems)
        if grant is not None:
            grants.append(grant)
    names = [g.name for g in grants]
    problems += [
        f"security.tokens: duplicate name {n!r}" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    seen: set[bytes] = set()
    for g in grants:
        if g.digest in seen:
            problems.append(f"security.tokens: token {g.name!r} has the same value as an earlier token")
        seen.add(g.digest)
    return SecurityConfig(
        tokens=tuple(grants), metrics_open=metrics_open, allow_unauthenticated=allow_unauthenticated
    )


def _flag(raw: dict[str, Any], key: str, env: Mapping[str, str], problems: list[str]) -> bool:
    """``security.<key>``, true or false; ``RAFTMQ_SECURITY_<KEY>`` overrides it."""
    value = raw.get(key, False)
    var = f"RAFTMQ_SECURITY_{key.upper()}"
    if var in env:
        value = env[var].lower() in ("1", "true", "yes", "on")
    if not isinstance(value, bool):
        problems.append(f"security.{key} must be true or false")
        return False
    return value


def _parse_grant(i: int, entry: Any, env: Mapping[str, str], problems: list[str]) -> TokenGrant | None:
    where = f"security.tokens[{i}]"
    if not isinstance(entry, dict):
        problems.append(f"{where} must be a table")
        return None
    problems += [
        f"unknown key {where}.{k}"
        for k in sorted(set(entry) - {"name", "sha256", "token", "metrics", *PERMISSIONS})
    ]
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"{where}.name must be 1-64 characters of A-Z a-z 0-9 _ . -")
        return None
    where = f"token {name!r}"
    grants = {p: _patterns(entry.get(p, []), f"{where}: {p}", problems) for p in PERMISSIONS}
    metrics = entry.get("metrics", False)
    if not isinstance(metrics, bool):
        problems.append(f"{where}: metrics must be true or false")
        return None
    token, sha256 = env.get(env_var(name)), entry.get("sha256")
    source = "env" if token is not None else "token" if "token" in entry else "sha256"
    if token is None:
        token = entry.get("token")
        if (token is None) == (sha256 is None):
            problems.append(f"{where}: set exactly one of sha256 and token (or {env_var(name)})")
            return None
    if token is not None:
        if not isinstance(token, str) or not (MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS):
            problems.append(f"{where}: the token must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} characters")
            return None
        if not _B64TOKEN.match(token):
            problems.append(f"{where}: the token may hold only A-Z a-z 0-9 - . _ ~ + / (and = at the end)")
            return None
        digest = token_digest(token)
    elif not isinstance(sha256, str) or not _HEX64.match(sha256):
        problems.append(f"{where}: sha256 must be 64 hex digits (the SHA-256 of the token)")
        return None
    else:
        digest = bytes.fromhex(sha256)
    return TokenGrant(name=name, digest=digest, metrics=metrics, source=source, **grants)


def _patterns(value: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and _PATTERN.match(p) for p in value):
        problems.append(f"{where} must be a list of topic name patterns (A-Z a-z 0-9 . _ - and * ? [ ] !)")
        return ()
    return tuple(value)
