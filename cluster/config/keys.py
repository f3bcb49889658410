"""The keys derived from the cluster secret, the proof a node gives of holding them, and the one
way raftmq compares a credential.

This module is the only reader of the raw cluster secret (``cluster.secret``). HKDF-SHA256 derives
one key per use, each under its own ``info`` label, so a key that leaks opens only what it guards
(HKDF's outputs under distinct labels are independent: one tells nothing of another or of the
secret)::

    peer     node-to-node HTTP: X-Raftmq-Peer-Key on every /internal call and forwarded request
    raft     every Raft connection: AES-256-GCM frames (replication/wire.py; the wire format is
             pickle, so this key is worth code execution on any node whose Raft port is reachable)
    backup   raftmq backup: X-Raftmq-Backup-Key, accepted only by the routes in BACKUP_ROUTES
    sqs      the AWS secret access key of each API token for the SQS API (:func:`sqs_secret_key`):
             HMAC(sqs key, the token's name and digest), so it is never stored anywhere, changes
             with the token and with the cluster secret, and cannot be computed from the cluster
             file's digests without the cluster secret

No key ever goes to an address that arrived in a request. A node being added proves it holds the
peer key instead (:func:`node_proof`): the prober sends a fresh random nonce to the open route
``POST /internal/proof``, without any credential, and the node answers
``HMAC-SHA256(peer key, PROOF_CONTEXT || nonce || its id || its http || its raft address)``. The
nonce makes each answer fresh; the node's own addresses in it make an answer relayed from another
node worthless for an address the relay controls.

Comparisons: :func:`same_credential` compares SHA-256 digests in constant time, so neither the
content nor the length of the expected value leaks through timing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "BACKUP_HEADER",
    "BACKUP_ROUTES",
    "LEGACY_HEADER",
    "NO_REDIRECTS",
    "PEER_HEADER",
    "PROOF_PATH",
    "ClusterKeys",
    "derive_keys",
    "new_nonce",
    "node_proof",
    "proof_matches",
    "same_credential",
    "sqs_secret_key",
]

PEER_HEADER = "X-Raftmq-Peer-Key"
BACKUP_HEADER = "X-Raftmq-Backup-Key"
# What nodes before the derived keys sent: the raw secret. Refused whatever it holds (see api/auth.py).
LEGACY_HEADER = "X-Raftmq-Secret"
PROOF_PATH = "/internal/proof"
# (method, route pattern, action) a backup key may call; action None: any (there is none).
BACKUP_ROUTES = frozenset(
    {
        ("GET", "/internal/status", None),
        ("POST", "/internal/groups/{group}/{action}", "barrier"),
        ("GET", "/internal/groups/{group}/checkpoint", None),
    }
)

# HKDF labels: never change one (every node of a cluster must derive the same keys).
_PEER_INFO = b"raftmq/v1/peer-http"
_RAFT_INFO = b"raftmq/v1/raft-password"
_BACKUP_INFO = b"raftmq/v1/backup"
_SQS_INFO = b"raftmq/v1/sqs-signing"
SQS_SECRET_CONTEXT = b"raftmq/v1/sqs-secret-access-key"
_SALT = b"raftmq cluster secret"
PROOF_CONTEXT = b"raftmq/v1/node-proof"
NONCE_BYTES = 32


@dataclass(frozen=True)
class ClusterKeys:
    """The keys of one cluster secret, as 64 hex digits each (they travel in headers)."""

    peer: str = field(repr=False)
    raft: str = field(repr=False)
    backup: str = field(repr=False)
    sqs: str = field(repr=False)

    def authorizes(self, headers: Mapping[str, str], *, backup: bool = False) -> bool:
        """The request carries the peer key, or (``backup``: the route takes it) the backup key."""
        if same_credential(headers.get(PEER_HEADER), self.peer):
            return True
        return backup and same_credential(headers.get(BACKUP_HEADER), self.backup)


def derive_keys(secret: str) -> ClusterKeys:
    """The keys of cluster secret ``secret``."""
    peer, raft, backup, sqs = (
        _derive(secret, info) for info in (_PEER_INFO, _RAFT_INFO, _BACKUP_INFO, _SQS_INFO)
    )
    return ClusterKeys(peer=peer, raft=raft, backup=backup, sqs=sqs)


def _derive(secret: str, info: bytes) -> str:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info)
    return hkdf.derive(secret.encode()).hex()


def same_credential(given: str | None, expected: str) -> bool:
    """``given`` equals ``expected``, compared as SHA-256 digests in constant time (the time
    depends on neither value's content nor on the expected length). None (no header): False."""
    if given is None:
        return False
    return hmac.compare_digest(_digest(given), _digest(expected))


def _digest(text: str) -> bytes:
    # surrogatepass: a header that is not valid text still hashes (and then does not match).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def sqs_secret_key(sqs_key: str, token_name: str, token_digest: bytes) -> str:
    """The AWS secret access key of the API token ``token_name`` (whose SHA-256 is
    ``token_digest``) for SigV4 on the SQS API: 40 characters of URL-safe base64, as long as AWS's.
    Its access key id is the token's name. Fields are length-prefixed, as in :func:`node_proof`."""
    mac = hmac.new(bytes.fromhex(sqs_key), SQS_SECRET_CONTEXT, hashlib.sha256)
    for part in (token_name.encode(), token_digest):
        mac.update(len(part).to_bytes(4, "big") + part)
    return base64.urlsafe_b64encode(mac.digest()[:30]).decode()


def new_nonce() -> str:
    """A fresh random nonce for a proof, as hex."""
    return secrets.token_hex(NONCE_BYTES)


def node_proof(peer_key: str, nonce: str, node_id: str, http: str, raft: str) -> str:
    """What a node holding ``peer_key`` answers to ``nonce``, as hex. Every field is length-prefixed,
    so no two different tuples hash the same bytes."""
    mac = hmac.new(bytes.fromhex(peer_key), PROOF_CONTEXT, hashlib.sha256)
    for part in (nonce, node_id, http, raft):
        data = part.encode("utf-8", "surrogatepass")
        mac.update(len(data).to_bytes(4, "big") + data)
    return mac.hexdigest()


def proof_matches(peer_key: str, nonce: str, node_id: str, http: str, raft: str, proof: object) -> bool:
    """``proof`` is the node's answer to ``nonce`` for exactly this id and these addresses
    (constant-time; anything that is not a string is no proof)."""
    if not isinstance(proof, str):
        return False
    return same_credential(proof, node_proof(peer_key, nonce, node_id, http, raft))


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the HTTP error it is, never followed: urllib would carry every
    header of the request (a key, a token) on to wherever the ``Location`` points."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


NO_REDIRECTS = _RefuseRedirects()  # for urllib.request.build_opener; it keeps no state
