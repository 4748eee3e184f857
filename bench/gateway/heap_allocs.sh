#!/usr/bin/env bash
# Heap allocations per proxied request in flotilla's gateway (issue #3: "no per-request heap
# churn on the hot path"), counted with a uprobe on libc's malloc: the 4 static nginx backends
# of ../shared/bench/peers (MODE=serve), the gateway with 1 worker, a warm-up, then
# `perf stat -e probe_libc:malloc` on the gateway during a fixed wrk run, divided by wrk's
# request count. Run as root (perf probe). Prints one line: allocations per request.
# With ATTRIBUTE=1 it also records the mallocs' call stacks (perf --call-graph dwarf) and prints
# the top callers, per request.
# Usage: bash bench/gateway/heap_allocs.sh      Environment: CONNS (8), SECS (4), FLOTILLA_BIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/backends.sh"
CONNS=${CONNS:-8}
SECS=${SECS:-4}
PORT=18090
LIBC=$(ldd "$BIN" | awk '/libc.so.6/ {print $3}')
command -v perf >/dev/null || { echo "needs perf (apt-get install -y linux-perf)" >&2; exit 1; }

start_backends
setsid "$BIN" gateway --listen 127.0.0.1:$PORT --workers 1 --log-level warn --balancer p2c \
  --upstreams "$UPSTREAMS" \
  >"$WORK/gateway.log" 2>&1 &
gateway=$!
pids+=("$gateway")
sleep 1
perf probe -q -x "$LIBC" malloc 2>/dev/null || true  # already there on a second run

load() { wrk -t1 -c"$CONNS" -d"$1"s -s "$PEERS_DIR/post.lua" http://127.0.0.1:$PORT/; }
load 2 >/dev/null  # warm: connections, pools and caches
perf stat -e probe_libc:malloc -p "$gateway" -o "$WORK/perf.txt" -- sleep $((SECS + 1)) &
sleep 0.3
requests=$(load "$SECS" | sed -n 's/.*reqs=\([0-9]*\).*/\1/p')
wait $!
mallocs=$(awk '/probe_libc:malloc/ {gsub(",", "", $1); print $1}' "$WORK/perf.txt")
awk -v m="$mallocs" -v r="$requests" \
  'BEGIN {printf "heap allocations per proxied request: %.2f (%d mallocs, %d requests)\n", m / r, m, r}'

if [[ ${ATTRIBUTE:-0} == 1 ]]; then
  load $((SECS + 1)) >"$WORK/wrk.txt" &
  loader=$!
  sleep 0.5
  perf record -q -e probe_libc:malloc --call-graph dwarf,16384 -p "$gateway" -o "$WORK/calls.data" \
    -- sleep 0.5 2>/dev/null
  wait "$loader"
  perf script -i "$WORK/calls.data" -F ip,sym 2>/dev/null |
    /usr/bin/python3 "$HERE/malloc_callers.py" "$(awk -v m="$mallocs" -v r="$requests" 'BEGIN {print m / r}')"
fi
