#!/bin/sh
# The raftmq image's entrypoint. With no arguments, or only options (e.g. --log-level debug), it runs
# this container's node:
#     raftmq serve --config "$RAFTMQ_CONFIG" --node "$RAFTMQ_NODE" --json-logs [options]
# Anything else is run as given (`docker run --rm raftmq raftmq status --url ...`).
set -eu
if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi
if [ -z "${RAFTMQ_NODE:-}" ]; then
    echo "raftmq: RAFTMQ_NODE is not set: set it to this container's node id in the cluster file" >&2
    exit 64
fi
if [ ! -r "$RAFTMQ_CONFIG" ]; then
    echo "raftmq: no readable cluster file at $RAFTMQ_CONFIG: mount one there (docs/deploy.md)" >&2
    exit 66
fi
if [ -z "${RAFTMQ_SECRET:-}" ] && ! grep -Eq '^[[:space:]]*secret[[:space:]]*=' "$RAFTMQ_CONFIG"; then
    echo "raftmq: RAFTMQ_SECRET is not set and $RAFTMQ_CONFIG has no cluster.secret:" \
        "pass the cluster secret (at least 16 characters) as RAFTMQ_SECRET" >&2
    exit 64
fi
exec raftmq serve --config "$RAFTMQ_CONFIG" --node "$RAFTMQ_NODE" --json-logs "$@"
