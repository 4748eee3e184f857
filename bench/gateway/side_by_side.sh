#!/usr/bin/env bash
# CPU per proxied request, flotilla's gateway against HAProxy (leastconn), counted so that the
# VM's drift cancels: both proxies run at once, each with 1 worker (thread), pinned to the same
# core (cpu1) and each in its own session, so each is its own scheduler group and gets half
# the core; each is driven to saturation by its own wrk (-c CONNS, the peers' small JSON POST)
# on cpu0 in front of the same 4 static nginx backends of ../shared/bench/peers. CPU per
# request is each process's own CPU time (user and kernel, /proc) over its requests in the
# same seconds, so both meet the same machine speed; cpu1's busy share says whether the
# proxies or the load were the bottleneck. (Latency is not comparable this way: each proxy
# waits for the other's time slices. run-peers.sh measures p99.)
# Usage: bash bench/gateway/side_by_side.sh     Environment: REPS (5), DURATION (6),
# CONNS ("64 256"), FLOTILLA_BIN. About 2 minutes per connection count.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/backends.sh"
REPS=${REPS:-5}
DURATION=${DURATION:-6}
CONNS=${CONNS:-64 256}
FLOTILLA_PORT=18090
HAPROXY_PORT=18091
for tool in wrk nginx haproxy taskset; do
  command -v $tool >/dev/null || { echo "needs $tool (bash scripts/setup.sh)" >&2; exit 1; }
done

mkdir -p "$WORK/haproxy"
servers=$(for i in 1 2 3 4; do printf '    server s%d 127.0.0.1:1808%d\n' "$i" "$i"; done)
render "$PEERS_DIR/conf/haproxy.cfg.tmpl" "$WORK/haproxy/haproxy.cfg" "RUN=$WORK/haproxy" \
  "THREADS=1" "BALANCE=leastconn" "SERVERS=$servers" "LISTEN=127.0.0.1:$HAPROXY_PORT"

wait_ready() {  # PORT
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -d '{}' "http://127.0.0.1:$1/" && return
    sleep 0.1
  done
  echo "nothing answers on port $1" >&2
  exit 1
}

# PORT CONNS SECONDS: req/s (wrk's RESULT line), non-2xx and socket errors refused.
load() {
  local result
  result=$(taskset -c 0 wrk -t1 -c"$2" -d"$3s" -s "$PEERS_DIR/post.lua" "http://127.0.0.1:$1/" |
    grep '^RESULT')
  grep -q 'sockerr=0 non2xx=0' <<<"$result" || { echo "errors: $result" >&2; exit 1; }
  sed -E 's/.*rps=([0-9.]+).*/\1/' <<<"$result"
}

cpu1_ticks() {  # busy and total ticks of cpu1
  awk '$1 == "cpu1" {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat
}

start_backends
setsid taskset -c 1 "$BIN" gateway --listen 127.0.0.1:$FLOTILLA_PORT --workers 1 \
  --log-level warn --balancer p2c --upstreams "$UPSTREAMS" >"$WORK/flotilla.log" 2>&1 &
flotilla_pid=$!
pids+=($!)
setsid taskset -c 1 haproxy -db -f "$WORK/haproxy/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
haproxy_pid=$!
pids+=($!)
wait_ready $FLOTILLA_PORT
wait_ready $HAPROXY_PORT

hz=$(getconf CLK_TCK)
echo "| conns | rep | flotilla req/s | HAProxy req/s | flotilla CPU-µs/req | HAProxy CPU-µs/req | cpu1 busy | CPU per request, flotilla / HAProxy |"
echo "|---|---|---|---|---|---|---|---|"
summary=()
for conns in $CONNS; do
  ratios=()
  for rep in $(seq "$REPS"); do
    load $FLOTILLA_PORT "$conns" 1 >"$WORK/warm" &
    warm=$!
    load $HAPROXY_PORT "$conns" 1 >/dev/null
    wait "$warm"
    read -r busy_before total_before < <(cpu1_ticks)
    flotilla_before=$(cpu_ticks $flotilla_pid)
    haproxy_before=$(cpu_ticks $haproxy_pid)
    load $FLOTILLA_PORT "$conns" "$DURATION" >"$WORK/flotilla.rps" &
    flotilla_load=$!
    haproxy_rps=$(load $HAPROXY_PORT "$conns" "$DURATION")
    wait "$flotilla_load"
    flotilla_rps=$(cat "$WORK/flotilla.rps")
    flotilla_ticks=$(($(cpu_ticks $flotilla_pid) - flotilla_before))
    haproxy_ticks=$(($(cpu_ticks $haproxy_pid) - haproxy_before))
    read -r busy_after total_after < <(cpu1_ticks)
    # CPU per request from each process's own ticks over the same seconds. (Were cpu1 not
    # busy throughout, the load would be the bottleneck, and the req/s alone would say nothing.)
    read -r flotilla_us haproxy_us ratio busy < <(awk -v ft="$flotilla_ticks" \
      -v ht="$haproxy_ticks" -v fr="$flotilla_rps" -v hr="$haproxy_rps" -v d="$DURATION" \
      -v hz="$hz" -v b=$((busy_after - busy_before)) -v t=$((total_after - total_before)) \
      'BEGIN {f = ft / hz * 1e6 / (fr * d); h = ht / hz * 1e6 / (hr * d);
              printf "%.1f %.1f %.3f %.0f%%\n", f, h, f / h, 100 * b / t}')
    ratios+=("$ratio")
    echo "| $conns | $rep | $flotilla_rps | $haproxy_rps | $flotilla_us | $haproxy_us | $busy | $ratio |"
  done
  summary+=("c=$conns: $(median "${ratios[@]}")")
done
echo
echo "median CPU per request, flotilla / HAProxy leastconn (side by side on one core, $REPS reps of ${DURATION}s): ${summary[*]}"
