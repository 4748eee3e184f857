#!/usr/bin/env bash
# What recording every request costs, counted rather than timed: user-space instructions per
# proxied request (every thread of the gateway: its worker and the table's writer or the
# trace exporter) with FEATURE off and on, under valgrind's callgrind, the setup of
# observability_cost.sh (1 worker, the 4 static nginx backends of ../shared/bench/peers, the
# peers' small JSON POST). Unlike req/s on this VM the count does not drift with the machine,
# so a change to the record path shows; it leaves out the kernel (the table's files take a
# write of a few hundred KiB per 100 ms batch) and cache effects.
# Usage: bash bench/gateway/observability_instructions.sh [table|trace]
# Environment: REQUESTS (10000), CONNS (16), FLOTILLA_BIN. About a minute.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/backends.sh"
FEATURE=${1:-table}
[[ $FEATURE == table || $FEATURE == trace ]] || { echo "FEATURE: table or trace" >&2; exit 2; }
REQUESTS=${REQUESTS:-10000}
CONNS=${CONNS:-16}
PORT=18090
for tool in valgrind callgrind_control hey nginx; do
  command -v $tool >/dev/null || { echo "needs $tool (bash scripts/setup.sh)" >&2; exit 1; }
done
URL=http://127.0.0.1:$PORT/serving-endpoints/default/invocations

load() {
  hey -n "$1" -c "$CONNS" -m POST -T application/json -D "$PEERS_DIR/body.json" "$URL" |
    awk '/\[200\]/ {print $2}'
}

# MODE: prints "MODE instructions-per-request".
measure() {
  local mode=$1 dir="$WORK/$1"
  mkdir -p "$dir"
  observability_config "$mode" "$FEATURE" >"$dir/gateway.yaml"
  local tracing=()
  [[ $mode == on && $FEATURE == trace ]] && tracing=(--otlp-endpoint http://127.0.0.1:18081/v1/traces)
  setsid valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.%p" \
    "$BIN" gateway --listen 127.0.0.1:$PORT --config "$dir/gateway.yaml" --workers 1 \
    --log-level warn --inference-dir "$dir/tables" "${tracing[@]}" >"$dir/gateway.log" 2>&1 &
  local proxy=$!
  pids+=("$proxy")
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -d '{}' "$URL" && break
    sleep 0.3
  done
  load 2000 >/dev/null
  sleep 2  # the warm-up's records are written (the writer drains every 100 ms) before zeroing
  callgrind_control -z "$proxy" >/dev/null 2>&1
  local ok
  ok=$(load "$REQUESTS")
  sleep 2  # and the measured ones are, before the dump
  callgrind_control -d "$proxy" >/dev/null 2>&1
  kill -TERM -- -"$proxy" 2>/dev/null || true
  wait "$proxy" 2>/dev/null || true
  [[ $ok == "$REQUESTS" ]] || { echo "$mode: only ${ok:-0} of $REQUESTS answered 200" >&2; exit 1; }
  # The dump after zeroing (file name ending .1) holds exactly the measured requests.
  awk -v mode="$mode" -v n="$REQUESTS" '/^summary:/ {printf "%s %.0f\n", mode, $2 / n}' \
    "$dir"/callgrind.*.1
}

start_backends
{
  measure off
  measure on
} >"$WORK/counts.txt"
awk -v feature="$FEATURE" '{count[$1] = $2}
     END {
       printf "instructions per request, %s off: %d, on: %d, on/off: %.3f (+%d)\n", feature,
         count["off"], count["on"], count["on"] / count["off"], count["on"] - count["off"]
     }' "$WORK/counts.txt"
