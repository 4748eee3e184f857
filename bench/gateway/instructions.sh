#!/usr/bin/env bash
# User-space instructions per proxied request: flotilla's gateway vs HAProxy (leastconn) and
# nginx (round robin), each with 1 worker in front of the same 4 static nginx backends of
# ../shared/bench/peers. Each proxy runs under valgrind's callgrind; after a warm-up its counts
# are zeroed, a fixed number of keep-alive POSTs go through it (hey), and the instructions
# executed in that span (libc included, the kernel not) are divided by the requests. Unlike
# req/s on this VM, the count does not drift with the machine's speed, so small changes to the
# request path show; it leaves out the kernel, about two thirds of a proxied request's CPU here.
# Usage: bash bench/gateway/instructions.sh     Environment: REQUESTS (10000), CONNS (16),
# FLOTILLA_BIN. About a minute.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/backends.sh"
REQUESTS=${REQUESTS:-10000}
CONNS=${CONNS:-16}
PORT=18090
for tool in valgrind callgrind_control hey nginx haproxy; do
  command -v $tool >/dev/null || { echo "needs $tool (bash scripts/setup.sh)" >&2; exit 1; }
done

ports=(18081 18082 18083 18084)
servers_haproxy=$(for i in 0 1 2 3; do printf '    server s%d 127.0.0.1:%s\n' $((i + 1)) "${ports[i]}"; done)
servers_nginx=$(for p in "${ports[@]}"; do printf '        server 127.0.0.1:%s max_fails=0;\n' "$p"; done)
mkdir -p "$WORK/haproxy" "$WORK/nginx"
render "$PEERS_DIR/conf/haproxy.cfg.tmpl" "$WORK/haproxy/haproxy.cfg" "RUN=$WORK/haproxy" \
  "THREADS=1" "BALANCE=leastconn" "SERVERS=$servers_haproxy" \
  "LISTEN=127.0.0.1:$PORT"
render "$PEERS_DIR/conf/nginx-proxy.conf.tmpl" "$WORK/nginx/nginx.conf" "RUN=$WORK/nginx" \
  "WORKERS=1" "BALANCE=# round robin" "SERVERS=$servers_nginx" \
  "KEEPALIVE=64" "LISTEN=127.0.0.1:$PORT"

load() {
  hey -n "$1" -c "$CONNS" -m POST -T application/json -D "$PEERS_DIR/body.json" \
    http://127.0.0.1:$PORT/ | awk '/\[200\]/ {print $2}'
}

# NAME COMMAND...: prints "NAME instructions-per-request".
measure() {
  local name=$1
  shift
  setsid valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.%p" "$@" \
    >"$WORK/$name.log" 2>&1 &
  local proxy=$!
  pids+=("$proxy")
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -d '{}' http://127.0.0.1:$PORT/ && break
    sleep 0.3
  done
  load 2000 >/dev/null
  callgrind_control -z "$proxy" >/dev/null 2>&1
  local ok
  ok=$(load "$REQUESTS")
  callgrind_control -d "$proxy" >/dev/null 2>&1
  kill -TERM -- -"$proxy" 2>/dev/null || true
  wait "$proxy" 2>/dev/null || true
  [[ $ok == "$REQUESTS" ]] || { echo "$name: only ${ok:-0} of $REQUESTS answered 200" >&2; exit 1; }
  # The dump after zeroing (file name ending .1) holds exactly the measured requests.
  awk -v name="$name" -v n="$REQUESTS" '/^summary:/ {printf "%s %.0f\n", name, $2 / n}' \
    "$WORK"/"$name".*.1
}

start_backends
{
  measure flotilla "$BIN" gateway --listen 127.0.0.1:$PORT --workers 1 --log-level warn \
    --balancer p2c --upstreams "$UPSTREAMS"
  measure haproxy haproxy -db -f "$WORK/haproxy/haproxy.cfg"
  measure nginx nginx -p "$WORK/nginx" -e "$WORK/nginx/error.log" -c "$WORK/nginx/nginx.conf" \
    -g 'daemon off; master_process off;'
} >"$WORK/counts.txt"

awk '{count[$1] = $2; order[NR] = $1}
     END {
       printf "%-9s %14s %12s\n", "proxy", "instr/request", "/ flotilla"
       for (i = 1; i <= NR; i++)
         printf "%-9s %14d %11.2fx\n", order[i], count[order[i]], count[order[i]] / count["flotilla"]
     }' "$WORK/counts.txt"
