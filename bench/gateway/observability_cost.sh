#!/usr/bin/env bash
# What recording every request costs the request path (issue 23): flotilla's gateway with 1
# worker, pinned to cpu1 (its writer or exporter thread too), in front of the 4 static nginx
# backends of ../shared/bench/peers (load and backends on cpu0), the same wrk load (-c CONNS,
# the peers' small JSON POST) with FEATURE off and on, interleaved REPS times with the order
# alternating. FEATURE is `table` (the endpoint's inference table, every request recorded with
# its bodies) or `trace` (spans of every request, sampled at 1.0, exported as OTLP/HTTP JSON to
# the first nginx backend, which answers 200). Prints each run's req/s and the gateway's
# CPU-µs per request, the per-rep ratio on/off, their medians, and what was recorded (records
# or spans, drops, and for tables compressed bytes per record).
# Usage: bash bench/gateway/observability_cost.sh [table|trace]     Environment: REPS (5),
# DURATION (10), CONNS (64), FLOTILLA_BIN. About 2 minutes.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/backends.sh"
FEATURE=${1:-table}
[[ $FEATURE == table || $FEATURE == trace ]] || { echo "FEATURE: table or trace" >&2; exit 2; }
REPS=${REPS:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
PORT=18090
for tool in wrk nginx taskset; do
  command -v $tool >/dev/null || { echo "needs $tool (bash scripts/setup.sh)" >&2; exit 1; }
done

config() {  # on|off
  local table=""
  [[ $1 == on && $FEATURE == table ]] && table="    inference_table: {enabled: true, sample_rate: 1, max_body_bytes: 65536}"
  cat <<EOF
endpoints:
  - name: default
$table
    versions:
      - name: v1
        replicas:
$(for p in 18081 18082 18083 18084; do echo "          - {id: r$p, address: \"127.0.0.1:$p\"}"; done)
EOF
}

cpu_ticks() {  # PID: utime + stime of every thread
  awk '{print $14 + $15}' "/proc/$1/stat"
}

# MODE: prints "req/s cpu_us_per_request records dropped bytes"
run() {
  local mode=$1 dir="$WORK/$1-$rep"
  mkdir -p "$dir"
  config "$mode" >"$dir/gateway.yaml"
  local tracing=()
  [[ $mode == on && $FEATURE == trace ]] && tracing=(--otlp-endpoint http://127.0.0.1:18081/v1/traces)
  setsid taskset -c 1 "$BIN" gateway --listen "127.0.0.1:$PORT" --config "$dir/gateway.yaml" \
    --workers 1 --log-level warn --inference-dir "$dir/tables" "${tracing[@]}" >"$dir/gateway.log" 2>&1 &
  local gw=$!
  pids+=("$gw")
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -d '{}' "http://127.0.0.1:$PORT/serving-endpoints/default/invocations" && break
    sleep 0.1
  done
  taskset -c 0 wrk -t1 -c"$CONNS" -d1s -s "$PEERS_DIR/post.lua" \
    "http://127.0.0.1:$PORT/serving-endpoints/default/invocations" >/dev/null
  local before after
  before=$(cpu_ticks "$gw")
  local result
  result=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$PEERS_DIR/post.lua" \
    "http://127.0.0.1:$PORT/serving-endpoints/default/invocations" | grep '^RESULT')
  after=$(cpu_ticks "$gw")
  local metrics
  metrics=$(curl -sf "http://127.0.0.1:$PORT/metrics")
  kill -TERM "$gw"
  wait "$gw" 2>/dev/null || true
  local rps reqs records dropped bytes
  rps=$(sed -E 's/.*rps=([0-9.]+).*/\1/' <<<"$result")
  reqs=$(sed -E 's/.*reqs=([0-9]+).*/\1/' <<<"$result")
  local recorded=flotilla_gateway_inference_records_total
  local lost=flotilla_gateway_inference_records_dropped_total
  if [[ $FEATURE == trace ]]; then
    recorded=flotilla_trace_spans_exported_total
    lost=flotilla_trace_spans_dropped_total
  fi
  records=$(awk -v m="$recorded" '$1 ~ "^" m {s += $2} END {print s + 0}' <<<"$metrics")
  dropped=$(awk -v m="$lost" '$1 ~ "^" m {s += $2} END {print s + 0}' <<<"$metrics")
  bytes=$(du -sb "$dir/tables" 2>/dev/null | cut -f1)
  local hz
  hz=$(getconf CLK_TCK)
  echo "$rps $(awk -v t=$((after - before)) -v hz="$hz" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}') $records $dropped ${bytes:-0}"
}

start_backends
echo "feature: $FEATURE"
echo "| rep | off req/s | on req/s | on/off | off CPU-µs/req | on CPU-µs/req | records | dropped | bytes/record |"
echo "|---|---|---|---|---|---|---|---|---|"
ratios=()
for rep in $(seq "$REPS"); do
  if ((rep % 2)); then order="off on"; else order="on off"; fi
  declare -A got=()
  for mode in $order; do
    got[$mode]=$(run "$mode")
  done
  read -r off_rps off_cpu _ _ _ <<<"${got[off]}"
  read -r on_rps on_cpu records dropped bytes <<<"${got[on]}"
  ratio=$(awk -v a="$on_rps" -v b="$off_rps" 'BEGIN {printf "%.3f", a / b}')
  ratios+=("$ratio")
  per_record=$(awk -v b="$bytes" -v r="$records" 'BEGIN {printf "%.1f", (r > 0) ? b / r : 0}')
  echo "| $rep | $off_rps | $on_rps | $ratio | $off_cpu | $on_cpu | $records | $dropped | $per_record |"
  unset got
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
echo
echo "median req/s with $FEATURE on / off: $median (c=$CONNS, ${DURATION}s runs, $REPS reps; $(nproc) CPUs)"
