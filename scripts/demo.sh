#!/usr/bin/env bash
# From a fresh Debian 12 machine to the demo: installs, builds, trains two small real XGBoost
# models on iris (python3-xgboost), starts `flotilla up`, deploys v1 behind the gateway, sends
# predictions, updates the endpoint to v2 under load and prints how many requests failed during
# the rollout (zero), then shuts everything down with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
flotilla="$PWD/build/release/flotilla"

workdir="$(mktemp -d)"
up_pid=""
cleanup() {
  if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
    kill -TERM "$up_pid"
    wait "$up_pid" || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT

echo "== training models (python3-xgboost) into $workdir"
/usr/bin/python3 tests/fixtures/make_models.py "$workdir" >/dev/null

echo "== flotilla up --data-dir $workdir/data   (free ports instead of 8080/8081/8082 for the demo)"
coproc UP { exec "$flotilla" up --data-dir "$workdir/data" --gateway-addr 127.0.0.1:0 \
  --api-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --log-level warn; }
up_pid=$UP_PID
read -r -t 30 addresses <&"${UP[0]}"
echo "   $addresses"
api=$(echo "$addresses" | sed -E 's/.*api http:\/\/([0-9.:]+).*/\1/')
gateway=$(echo "$addresses" | sed -E 's/.*gateway (http:\/\/[0-9.:]+).*/\1/')
export FLOTILLA_API="$api"
FLOTILLA_TOKEN="$(cat "$workdir/data/admin.token")"
export FLOTILLA_TOKEN

cat >"$workdir/iris-v1.yaml" <<EOF
name: iris
served_models:
  - name: v1
    model: mlflow_classifier        # relative to this file: XGBClassifier, predicts labels
    concurrency: {min: 1, max: 64}
EOF
cat >"$workdir/iris-v2.yaml" <<EOF
name: iris
served_models:
  - name: v2
    model: multiclass.ubj           # a Booster with multi:softprob: predicts probabilities
    concurrency: {min: 1, max: 64}
EOF

run() {
  echo
  echo "\$ flotilla $*"
  "$flotilla" "$@"
}

run deploy -f "$workdir/iris-v1.yaml"
run predict iris --json '{"instances": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}'
run ls

echo
echo "== updating iris to v2 while 4 clients send requests through the gateway"
body='{"instances": [[5.1, 3.5, 1.4, 0.2]]}'
/usr/bin/python3 scripts/load_client.py --url "$gateway/serving-endpoints/iris/invocations" \
  --token "$FLOTILLA_TOKEN" --body "$body" --threads 4 --stop-file "$workdir/stop" \
  >"$workdir/load.json" &
load_pid=$!
sleep 1
run deploy -f "$workdir/iris-v2.yaml"
sleep 2  # v1 drains and stops while the load goes on
touch "$workdir/stop"
wait "$load_pid"
/usr/bin/python3 - "$workdir/load.json" <<'EOF'
import json, sys
load = json.load(open(sys.argv[1]))
print(f"\n   requests during the rollout: {load['requests']}, failed: {load['failed']}")
for failure in load["failures"]:
    print("   failure:", failure)
EOF

run predict iris --json '{"instances": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}'
run events iris

echo
echo "== stopping flotilla up (SIGTERM: the gateway drains, then every replica drains and stops)"
kill -TERM "$up_pid"
wait "$up_pid" && echo "   flotilla up exited with status 0"
up_pid=""
