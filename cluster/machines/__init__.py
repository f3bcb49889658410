"""The pure state machines: queue group, metadata, placement, membership, delivery.

No I/O beyond the ``Store`` protocol, no clock: time arrives in commands (docs/architecture.md)."""
