#!/usr/bin/env bash
# From a fresh Debian 12 machine to the demo: installs, builds, trains a small real XGBoost
# model (python3-xgboost on scikit-learn's bundled breast-cancer and iris data), starts a
# replica on a free port, sends predictions through both protocols, prints them, and stops
# the replica with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null

workdir="$(mktemp -d)"
replica_pid=""
cleanup() {
  if [ -n "$replica_pid" ] && kill -0 "$replica_pid" 2>/dev/null; then
    kill -TERM "$replica_pid"
    wait "$replica_pid" || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT

echo "== training models (python3-xgboost) into $workdir"
/usr/bin/python3 tests/fixtures/make_models.py "$workdir" >/dev/null

echo "== starting: flotilla replica --model $workdir/mlflow_classifier --port 0"
coproc REPLICA { exec build/release/flotilla replica --model "$workdir/mlflow_classifier" --port 0 --log-level warn; }
replica_pid=$REPLICA_PID
read -r -t 30 listening <&"${REPLICA[0]}"
echo "   $listening"
port=$(echo "$listening" | sed -E 's/.*"port":([0-9]+).*/\1/')
base="http://127.0.0.1:$port"

show() {  # METHOD PATH [curl args...]
  local method="$1" path="$2"
  shift 2
  echo
  echo "\$ curl -X $method $path $*"
  curl -sS -X "$method" "$base$path" "$@"
  echo
}

show GET /v2/models/mlflow_classifier
show POST /v2/models/mlflow_classifier/infer -H 'Content-Type: application/json' \
  -d '{"id":"demo-1","inputs":[{"name":"input","datatype":"FP32","shape":[2,4],"data":[[5.1,3.5,1.4,0.2],[6.7,3.0,5.2,2.3]]}]}'
show POST /invocations -H 'Content-Type: application/json' \
  -d '{"dataframe_split":{"columns":["sepal_length","sepal_width","petal_length","petal_width"],"data":[[5.1,3.5,1.4,0.2],[5.9,3.0,4.2,1.5],[6.7,3.0,5.2,2.3]]}}'
show POST /invocations -H 'Content-Type: text/csv' \
  --data-binary $'sepal_length,sepal_width,petal_length,petal_width\n5.9,3.0,4.2,1.5\n'
show POST /invocations -H 'Content-Type: application/json' -d '{"instances": [[1, 2]]}'
echo
echo "\$ curl $base/metrics | grep requests_total"
curl -sS "$base/metrics" | grep '^flotilla_replica_requests_total' | grep -v ' 0$'

echo
echo "== stopping the replica (SIGTERM drains in-flight requests, then exits 0)"
kill -TERM "$replica_pid"
wait "$replica_pid" && echo "   replica exited with status 0"
replica_pid=""
