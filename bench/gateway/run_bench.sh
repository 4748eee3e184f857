#!/usr/bin/env bash
# The gateway's benchmarks (issue #3), each measuring flotilla and its peers in the same run:
#   1. throughput: flotilla gateway vs nginx (round robin, random two least_conn) and HAProxy
#      (leastconn), each proxying to the same 4 static nginx backends, 1 worker pinned to cpu1,
#      wrk -c64 and -c256 (../shared/bench/peers/run-peers.sh, REPS interleaved runs).
#   2. heterogeneous replicas (3 fast + 1 slow, 1 slot each) at a fixed Poisson rate: p99 with
#      flotilla's P2C (weighed by response time), its P2C on in-flight counts alone, its round
#      robin, nginx round robin / P2C and HAProxy leastconn, flotilla's P2C with a per-replica
#      cap of 1 (requests wait at the gateway instead), and the fleet without the slow replica.
#   3. gateway-added latency at half of the gateway's max load, HAProxy alongside
#      (bench/gateway/added_latency.py).
# Usage: bash bench/gateway/run_bench.sh [throughput|hetero|latency|all]   (default all)
# Environment: REPS (3), DURATION (10), RATES ("300"), FLOTILLA_BIN (build/release/flotilla).
# Takes about 12 minutes for `all`. Needs nginx, haproxy, wrk (bash scripts/setup.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PEERS_DIR=$(cd "$REPO/../shared/bench/peers" && pwd)
BIN=${FLOTILLA_BIN:-$REPO/build/release/flotilla}
REPS=${REPS:-3}
DURATION=${DURATION:-10}
RATES=${RATES:-300}
WHAT=${1:-all}

[[ -x $BIN ]] || { echo "build first: bash scripts/build.sh ($BIN missing)" >&2; exit 1; }
gateway_cmd() {  # BALANCER [extra flags]
  echo "$BIN gateway --listen 127.0.0.1:\$GATEWAY_PORT --upstreams \$UPSTREAMS --workers \$WORKERS --log-level warn --balancer $*"
}

if [[ $WHAT == throughput || $WHAT == all ]]; then
  echo "### throughput (run-peers.sh, REPS=$REPS, ${DURATION}s per run)"
  (cd "$PEERS_DIR" && GATEWAY_CMD=$(gateway_cmd p2c) GATEWAY_NAME=flotilla REPS=$REPS \
     DURATION=$DURATION MAX_TOTAL=$((REPS * 6 * (DURATION + 4) + 30)) \
     PEERS="nginx-rr nginx-p2c haproxy-lc" ./run-peers.sh 2>/dev/null)
fi

if [[ $WHAT == hetero || $WHAT == all ]]; then
  hetero() {  # NAME GATEWAY_CMD PEERS TARGETS [HETERO_SPEC]
    (cd "$PEERS_DIR" && MODE=hetero RATES="$RATES" GATEWAY_CMD="$2" GATEWAY_NAME=$1 REPS=$REPS \
       DURATION=$DURATION MAX_TOTAL=$((REPS * $4 * (DURATION + 4) + 30)) PEERS="$3" \
       HETERO_SPEC="${5:-exp:2 exp:2 exp:2 exp:10}" ./run-peers.sh 2>/dev/null)
  }
  echo "### heterogeneous replicas, flotilla P2C weighed by response time and peers (run-peers.sh MODE=hetero)"
  hetero flotilla-p2c "$(gateway_cmd p2c)" "nginx-rr nginx-p2c haproxy-lc" 4
  echo "### heterogeneous replicas, flotilla P2C on in-flight counts alone (the policy before issue #25)"
  hetero flotilla-p2c-in-flight "$(gateway_cmd p2c_in_flight)" "haproxy-lc" 2
  echo "### heterogeneous replicas, flotilla round robin (the same load)"
  hetero flotilla-rr "$(gateway_cmd round_robin)" "nginx-rr" 2
  echo "### heterogeneous replicas, flotilla P2C with a per-replica cap of 1 (the replicas' slots)"
  hetero flotilla-cap1 "$(gateway_cmd p2c) --max-in-flight 1" "haproxy-lc" 2
  echo "### the same fleet without the slow replica (4 x exp 2 ms): the moonshot's reference"
  hetero flotilla-p2c "$(gateway_cmd p2c)" "haproxy-lc" 2 "exp:2 exp:2 exp:2 exp:2"
fi

if [[ $WHAT == latency || $WHAT == all ]]; then
  echo "### gateway-added latency at half of max load"
  FLOTILLA_BIN=$BIN /usr/bin/python3 "$HERE/added_latency.py" --reps "$REPS" --duration "$DURATION"
fi
