# Sourced by the bench/gateway scripts that measure one proxy at a time: paths, a scratch
# directory, and the 4 static nginx backends of ../shared/bench/peers (127.0.0.1:18081-18084,
# started with MODE=serve), all stopped on exit.
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PEERS_DIR=$(cd "$REPO/../shared/bench/peers" && pwd)
BIN=${FLOTILLA_BIN:-$REPO/build/release/flotilla}
UPSTREAMS=127.0.0.1:18081,127.0.0.1:18082,127.0.0.1:18083,127.0.0.1:18084
WORK=$(mktemp -d)
[[ -x $BIN ]] || { echo "build first: bash scripts/build.sh ($BIN missing)" >&2; exit 1; }

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM -- -"$pid" 2>/dev/null || true; done
  sleep 1  # run-peers.sh stops its backends on TERM
  rm -rf "$WORK"
}
trap cleanup EXIT

start_backends() {
  MODE=serve PEERS=haproxy-lc SERVE_SECS=900 setsid "$PEERS_DIR/run-peers.sh" >"$WORK/serve.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do grep -q "serving:" "$WORK/serve.log" 2>/dev/null && break; sleep 0.2; done
  grep -q "serving:" "$WORK/serve.log" || { cat "$WORK/serve.log"; exit 1; }
}

# MODE FEATURE (observability_cost.sh, observability_instructions.sh): a gateway config of one
# endpoint over the 4 backends, its inference table on (every request, bodies kept) when MODE
# is `on` and FEATURE is `table`.
observability_config() {
  local table=""
  [[ $1 == on && $2 == table ]] && table="    inference_table: {enabled: true, sample_rate: 1, max_body_bytes: 65536}"
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

# TEMPLATE OUT KEY=VALUE...: ../shared/bench/peers' templates, filled in as run-peers.sh does
# (@KEY@ -> VALUE).
render() {
  local out=$2 kv
  cp "$1" "$out"
  shift 2
  for kv in "$@"; do K="@${kv%%=*}@" V="${kv#*=}" perl -0pi -e 's/\Q$ENV{K}\E/$ENV{V}/g' "$out"; done
}

cpu_ticks() {  # PID: utime + stime of every thread
  awk '{print $14 + $15}' "/proc/$1/stat"
}

median() {  # VALUE...: their median
  printf '%s\n' "$@" | sort -n |
    awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
