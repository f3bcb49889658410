#!/bin/sh
# Runs the node under libfaketime when RAFTMQ_FAKETIME=1, so that the chaos harness can skew this
# node's wall clock while it runs by writing an offset ("+30s", "-2m", "+0") into the file
# $FAKETIME_TIMESTAMP_FILE (default /data/faketime, on the node's volume). The file is re-read at
# most once a second.
#
# Both the wall clock and the monotonic clock of the node move: libfaketime 0.9.10 (bookworm's) with
# FAKETIME_DONT_FAKE_MONOTONIC=1 makes Python 3.11's time.sleep() fail with EINVAL (it sleeps with
# clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)), which kills pysyncobj's tick thread. So a skew
# here is a clock *jump* as the whole process sees it: forward, timers fire early (elections);
# backward, timers stall for the size of the jump (like a pause).
set -e
if [ "${RAFTMQ_FAKETIME:-0}" = "1" ]; then
    lib=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n 1)
    if [ -z "$lib" ]; then
        echo "raftmq-entrypoint: RAFTMQ_FAKETIME=1 but libfaketime is not installed" >&2
        exit 2
    fi
    export FAKETIME_TIMESTAMP_FILE="${FAKETIME_TIMESTAMP_FILE:-/data/faketime}"
    [ -s "$FAKETIME_TIMESTAMP_FILE" ] || echo "+0" > "$FAKETIME_TIMESTAMP_FILE"
    export FAKETIME_CACHE_DURATION="${FAKETIME_CACHE_DURATION:-1}"
    export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
fi
exec "$@"
