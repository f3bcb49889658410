"""The base room of the server: the error root and its catalogue, the clock, group names, timing.

Imports nothing else of ``cluster/`` (docs/architecture.md, "Layers")."""
