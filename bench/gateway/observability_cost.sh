#!/usr/bin/env bash
# What recording every request costs the request path (issue 23): flotilla's gateway with 1
# worker, pinned to cpu1 (its writer or exporter thread too), in front of the 4 static nginx
# backends of ../shared/bench/peers (load and backends on cpu0), the same wrk load (-c CONNS,
# the peers' small JSON POST) with FEATURE off and on, interleaved REPS times with the order
# alternating. FEATURE is `table` (the endpoint's inference table, every request recorded with
# its bodies) or `trace` (spans of every request, sampled at 1.0, exported as OTLP/HTTP JSON to
# the first nginx backend, which answers 200). TOGETHER=1 runs the two gateways side by side
# on cpu1 instead, each under its own wrk (see run_together): steadier on a drifting VM.
# Prints each run's req/s and the gateway's CPU-µs per request, the per-rep ratio on/off,
# their medians, and what was recorded (records or spans, drops, and for tables compressed
# bytes per record).
# Usage: bash bench/gateway/observability_cost.sh [table|trace]     Environment: REPS (5),
# DURATION (10), CONNS (64), TOGETHER (0), FLOTILLA_BIN. About 2 minutes.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/backends.sh"
FEATURE=${1:-table}
[[ $FEATURE == table || $FEATURE == trace ]] || { echo "FEATURE: table or trace" >&2; exit 2; }
REPS=${REPS:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
TOGETHER=${TOGETHER:-0}
PORT=18090
for tool in wrk nginx taskset; do
  command -v $tool >/dev/null || { echo "needs $tool (bash scripts/setup.sh)" >&2; exit 1; }
done

# MODE PORT: starts a gateway with FEATURE off or on (its own session, so its own scheduler
# group) and waits for it; sets `gw` to its pid.
start_gateway() {
  local mode=$1 port=$2 dir="$WORK/$1-$rep"
  mkdir -p "$dir"
  observability_config "$mode" "$FEATURE" >"$dir/gateway.yaml"
  local tracing=()
  [[ $mode == on && $FEATURE == trace ]] && tracing=(--otlp-endpoint http://127.0.0.1:18081/v1/traces)
  setsid taskset -c 1 "$BIN" gateway --listen "127.0.0.1:$port" --config "$dir/gateway.yaml" \
    --workers 1 --log-level warn --inference-dir "$dir/tables" "${tracing[@]}" >"$dir/gateway.log" 2>&1 &
  gw=$!
  pids+=("$gw")
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -d '{}' "http://127.0.0.1:$port/serving-endpoints/default/invocations" && break
    sleep 0.1
  done
}

# PORT SECONDS: wrk's RESULT line for the gateway at PORT.
load() {
  taskset -c 0 wrk -t1 -c"$CONNS" -d"$2s" -s "$PEERS_DIR/post.lua" \
    "http://127.0.0.1:$1/serving-endpoints/default/invocations" | grep '^RESULT'
}

# MODE PID PORT RESULT BEFORE AFTER: stops the gateway and prints
# "req/s cpu_us_per_request records dropped bytes".
report() {
  local mode=$1 pid=$2 port=$3 result=$4 before=$5 after=$6 dir="$WORK/$1-$rep"
  local metrics
  metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
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

# MODE: one gateway alone on cpu1; prints report's line.
run() {
  local mode=$1 gw
  start_gateway "$mode" "$PORT"
  load "$PORT" 1 >/dev/null
  local before after result
  before=$(cpu_ticks "$gw")
  result=$(load "$PORT" "$DURATION")
  after=$(cpu_ticks "$gw")
  report "$mode" "$gw" "$PORT" "$result" "$before" "$after"
}

# Both gateways at once on cpu1, each under its own wrk: they share the core half and half
# (each is its own session, so its own group to the scheduler), so both meet the same machine
# speed, which drifts by ±20% over minutes here; the ratio of their req/s is the inverse
# ratio of their CPU per request. Sets got[off] and got[on].
run_together() {
  local gw off_gw on_gw
  start_gateway off "$PORT"
  off_gw=$gw
  start_gateway on $((PORT + 1))
  on_gw=$gw
  load "$PORT" 1 >/dev/null &
  local warm=$!
  load $((PORT + 1)) 1 >/dev/null
  wait "$warm"
  local off_before on_before off_after on_after
  off_before=$(cpu_ticks "$off_gw")
  on_before=$(cpu_ticks "$on_gw")
  load "$PORT" "$DURATION" >"$WORK/off.result" &
  local off_load=$!
  load $((PORT + 1)) "$DURATION" >"$WORK/on.result"
  wait "$off_load"
  off_after=$(cpu_ticks "$off_gw")
  on_after=$(cpu_ticks "$on_gw")
  got[off]=$(report off "$off_gw" "$PORT" "$(cat "$WORK/off.result")" "$off_before" "$off_after")
  got[on]=$(report on "$on_gw" $((PORT + 1)) "$(cat "$WORK/on.result")" "$on_before" "$on_after")
}

start_backends
echo "feature: $FEATURE"
recorded_column="records"
[[ $FEATURE == trace ]] && recorded_column="spans exported"
echo "| rep | off req/s | on req/s | on/off | off CPU-µs/req | on CPU-µs/req | $recorded_column | dropped | bytes/record |"
echo "|---|---|---|---|---|---|---|---|---|"
ratios=()
for rep in $(seq "$REPS"); do
  if ((rep % 2)); then order="off on"; else order="on off"; fi
  declare -A got=()
  if [[ $TOGETHER == 1 ]]; then
    run_together
  else
    for mode in $order; do
      got[$mode]=$(run "$mode")
    done
  fi
  read -r off_rps off_cpu _ _ _ <<<"${got[off]}"
  read -r on_rps on_cpu records dropped bytes <<<"${got[on]}"
  ratio=$(awk -v a="$on_rps" -v b="$off_rps" 'BEGIN {printf "%.3f", a / b}')
  ratios+=("$ratio")
  per_record=$(awk -v b="$bytes" -v r="$records" 'BEGIN {printf "%.1f", (r > 0) ? b / r : 0}')
  echo "| $rep | $off_rps | $on_rps | $ratio | $off_cpu | $on_cpu | $records | $dropped | $per_record |"
  unset got
done
median=$(median "${ratios[@]}")
echo
how="one after the other"
[[ $TOGETHER == 1 ]] && how="side by side on one core"
echo "median req/s with $FEATURE on / off: $median (c=$CONNS, ${DURATION}s runs, $REPS reps, $how; $(nproc) CPUs)"
