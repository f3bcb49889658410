"""TLS contexts for the HTTP API: the server side of one node, the client side of its peer calls.

A node serves HTTPS when its ``tls_cert_file``/``tls_key_file`` are set (``[tls]`` gives every node
a default). Peers call each other over HTTPS then, verifying the certificate and the host name
against ``tls.ca_file`` (or the system's CAs); ``tls.verify = false`` turns verification off.
"""

from __future__ import annotations

import ssl

from raftmq.cluster.config.cluster_file import ClusterConfig, NodeConfig
from raftmq.errors import RaftmqError

__all__ = ["TlsError", "client_context", "server_context"]


class TlsError(RaftmqError):
    """A certificate, key or CA file cannot be used; ``str(e)`` names the file and the reason."""


def server_context(node: NodeConfig) -> ssl.SSLContext | None:
    """The context ``node`` serves HTTPS with, or None when it serves plain HTTP."""
    if not node.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(node.tls_cert_file, node.tls_key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(
            f"node {node.id}: cannot load the TLS certificate {node.tls_cert_file!r} with the key "
            f"{node.tls_key_file!r}: {_reason(e)}"
        ) from None
    return context


def client_context(config: ClusterConfig) -> ssl.SSLContext | None:
    """The context of this node's calls to its peers, or None when the cluster runs plain HTTP."""
    if not config.tls_enabled:
        return None
    try:
        context = ssl.create_default_context(cafile=config.tls.ca_file or None)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the CA file {config.tls.ca_file!r}: {_reason(e)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not config.tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _reason(e: OSError) -> str:
    return e.strerror or str(e)
