"""The cluster file, API tokens, TLS and the keys derived from the cluster secret.

Imports only ``cluster/base/`` (docs/architecture.md, "Layers")."""
