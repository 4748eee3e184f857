#!/usr/bin/python3
"""Cold start and rollout time of `flotilla up` (issue #4), in one run.

Cold start, per runtime (--runtimes): an endpoint at one replica is scaled to two by raising
concurrency.min (a scale-up decision, as the autoscaler will make it); measured from the API call
returning to the new replica being ready in the gateway's table (polled every 5 ms through the
API), and, from the orchestrator's own record, from process start (or warm-pool take-over) to its
first successful readiness probe. Runs alternate between runtimes and between a
`flotilla up --warm-pool 1` and a `flotilla up --warm-pool 0`, so machine noise hits all alike.
- xgboost: a real XGBoost model (iris classifier, MLflow directory, tests/fixtures/make_models.py).
- llm: issue 7's benchmark-shaped Llama (~50M parameters, random bf16 weights, context 512) from
  tests/fixtures/make_llm.py --bench, as bench/llm/llm_bench.py serves it, with `runtime: llm`.
  A spec has no --skip-tokenizer, and a replica refuses a directory without tokenizer files, so
  the Llama 3 style tokenizer fixture (tests/fixtures/make_tokenizers.py, 1011 tokens) is copied
  in, as make_llm.py --with-tokenizer does for its chat model. The replica's other flags are the
  defaults `flotilla up` gives every replica (its KV cache: 64 full contexts, fp32).
The warm pool is per runtime: the "from pool" column says how many new replicas a standby took.

Rollout: an update to a new model version under load (4 closed-loop clients through the
gateway): time until traffic has switched, time until the old replica has stopped, and the
failed requests (must be 0).

Usage: bench/control/cold_start.py [--runs 7] [--rollouts 5] [--runtimes xgboost,llm]
       (needs build/release/flotilla, or FLOTILLA_BIN)
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build/release/flotilla"))
FIXTURES = os.path.join(ROOT, "tests/fixtures")
RUNTIMES = ("xgboost", "llm")


class Up:
    """One `flotilla up` on free ports with its own data directory."""

    def __init__(self, workdir, warm_pool, extra=()):
        self.data_dir = os.path.join(workdir, f"data-pool{warm_pool}")
        self.process = subprocess.Popen(
            [FLOTILLA, "up", "--data-dir", self.data_dir, "--gateway-addr", "127.0.0.1:0",
             "--api-addr", "127.0.0.1:0", "--grpc-addr", "off", "--warm-pool", str(warm_pool),
             "--log-level", "warn",
             # The scale-up decision comes through the API here (concurrency.min), and goes
             # the path the autoscaler's decisions go: reconciler, orchestrator, gateway table.
             "--no-autoscale", *extra],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self.process.stdout.readline()
        match = re.search(r"gateway (http://[0-9.:]+), api (http://[0-9.:]+)", line)
        if not match:
            raise RuntimeError("flotilla up did not start: " + line)
        self.gateway, self.api = match.group(1), match.group(2)
        with open(os.path.join(self.data_dir, "admin.token")) as f:
            self.token = f.read().strip()

    def call(self, method, path, body=None):
        request = urllib.request.Request(
            self.api + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + self.token, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def wait(self, name, predicate, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = self.call("GET", "/api/2.0/serving-endpoints/" + name)
            if predicate(view):
                return view
            time.sleep(0.005)
        raise RuntimeError(f"{name}: condition not met in {timeout} s")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def spec(name, model, version="v1", min_concurrency=1, runtime=None):
    served = {"name": version, "model": model, "concurrency": {"min": min_concurrency, "max": 64}}
    if runtime:
        served["runtime"] = runtime
    return {"name": name, "served_models": [served]}


def make_llm(workdir):
    """The benchmark-shaped Llama of bench/llm/llm_bench.py, with tokenizer files (see above)."""
    subprocess.run(["/usr/bin/python3", os.path.join(FIXTURES, "make_llm.py"), workdir, "--bench"],
                   check=True, stdout=subprocess.DEVNULL)
    tokenizers = os.path.join(workdir, "tokenizers")
    subprocess.run(["/usr/bin/python3", os.path.join(FIXTURES, "make_tokenizers.py"), tokenizers],
                   check=True, stdout=subprocess.DEVNULL)
    model = os.path.join(workdir, "bench-50m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizers, "llama3", name), model)
    return model


def ready(view, count):
    return sum(r["state"] == "ready" for r in view["replicas"]) >= count and \
        view["state"]["config_update"] == "NOT_UPDATING"


def cold_start_once(up, runtime, model):
    """Scale 1 → 2 replicas; returns (decision to ready in the table, process start to ready)."""
    # 17 needs two replicas: the per-replica target is 16 for both runtimes (--no-autoscale).
    name = "cold-" + runtime
    path = "/api/2.0/serving-endpoints/" + name
    before = {r["id"] for r in up.call("GET", path)["replicas"]}
    start = time.monotonic()
    up.call("PUT", path + "/config", spec(name, model, min_concurrency=17, runtime=runtime))
    view = up.wait(name, lambda v: ready(v, 2))
    observed = time.monotonic() - start
    new = [r for r in view["replicas"] if r["id"] not in before and r["state"] == "ready"][0]
    orchestrated = (new["ready_unix_ms"] - new["started_unix_ms"]) / 1000.0
    up.call("PUT", path + "/config", spec(name, model, min_concurrency=1, runtime=runtime))
    up.wait(name, lambda v: len(v["replicas"]) == 1 and ready(v, 1))
    return observed, orchestrated, new["from_warm_pool"]


def rollout_once(up, models, index, workdir):
    stop_file = os.path.join(workdir, f"stop-{index}")
    load = subprocess.Popen(
        ["/usr/bin/python3", os.path.join(ROOT, "scripts/load_client.py"), "--url",
         up.gateway + "/serving-endpoints/roll/invocations", "--token", up.token, "--body",
         json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]}), "--threads", "4", "--stop-file",
         stop_file], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    version = f"v{index + 2}"
    start = time.monotonic()
    up.call("PUT", "/api/2.0/serving-endpoints/roll/config",
            spec("roll", models[index % 2], version=version))
    up.wait("roll", lambda v: v["state"]["config_update"] == "NOT_UPDATING")
    switched = time.monotonic() - start
    up.wait("roll", lambda v: all(r["version"] == version for r in v["replicas"]
                                  if r["state"] != "failed"))
    finished = time.monotonic() - start
    time.sleep(0.3)
    open(stop_file, "w").close()
    counts = json.loads(load.communicate(timeout=60)[0])
    return switched, finished, counts["requests"], counts["failed"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--runtimes", default=",".join(RUNTIMES),
                        help="runtimes whose cold start is measured, comma-separated")
    args = parser.parse_args()
    runtimes = list(dict.fromkeys(args.runtimes.split(",")))  # in order, each once
    if not runtimes or any(r not in RUNTIMES for r in runtimes):
        parser.error(f"--runtimes: a comma-separated list of {', '.join(RUNTIMES)}")

    with tempfile.TemporaryDirectory() as workdir:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_models.py"),
                        workdir], check=True, stdout=subprocess.DEVNULL)
        model = os.path.join(workdir, "mlflow_classifier")
        cold_models = {"xgboost": model}
        if "llm" in runtimes:
            cold_models["llm"] = make_llm(workdir)
        ups = {pool: Up(workdir, pool) for pool in (1, 0)}
        try:
            for up in ups.values():
                for runtime in runtimes:
                    name = "cold-" + runtime
                    up.call("POST", "/api/2.0/serving-endpoints",
                            spec(name, cold_models[runtime], runtime=runtime))
                    up.wait(name, lambda v: ready(v, 1))
            results = {(runtime, pool): [] for runtime in runtimes for pool in ups}
            for _ in range(args.runs):
                for runtime in runtimes:
                    for pool, up in ups.items():
                        time.sleep(1.0)  # the pool refills after each take
                        results[runtime, pool].append(
                            cold_start_once(up, runtime, cold_models[runtime]))
            # The rollouts below run as they did before the llm runtime was measured: without
            # its idle replicas (600 MB each) beside them.
            for up in ups.values():
                for runtime in runtimes:
                    if runtime != "xgboost":
                        up.call("DELETE", "/api/2.0/serving-endpoints/cold-" + runtime)

            print("== cold start: scale-up decision to a ready replica (xgboost: iris classifier; "
                  "llm: bench-50m, bf16)")
            print(f"{'runtime':<9}{'mode':<22}{'runs':>5}{'decision→ready ms':>20}"
                  f"{'start→ready ms':>17}{'from pool':>11}")
            medians = {}
            for runtime in runtimes:
                for pool, label in ((1, "warm pool (default)"), (0, "fresh process")):
                    rows = results[runtime, pool]
                    observed = statistics.median(r[0] for r in rows) * 1000
                    orchestrated = statistics.median(r[1] for r in rows) * 1000
                    from_pool = sum(r[2] for r in rows)
                    medians[runtime, pool] = (observed, orchestrated)
                    print(f"{runtime:<9}{label:<22}{len(rows):>5}{observed:>20.1f}"
                          f"{orchestrated:>17.1f}{from_pool:>8}/{len(rows)}")
            for runtime in runtimes:
                fresh, warm = medians[runtime, 0], medians[runtime, 1]
                print(f"ratio fresh / warm pool ({runtime}): decision→ready "
                      f"{fresh[0] / warm[0]:.2f}x, start→ready {fresh[1] / warm[1]:.2f}x")

            up = ups[1]
            models = [os.path.join(workdir, "multiclass.ubj"), model]
            up.call("POST", "/api/2.0/serving-endpoints", spec("roll", model))
            up.wait("roll", lambda v: ready(v, 1))
            rollouts = [rollout_once(up, models, i, workdir) for i in range(args.rollouts)]
            print("\n== zero-downtime rollout under load (4 clients, warm pool), "
                  f"{args.rollouts} rollouts")
            print(f"median to traffic switched: {statistics.median(r[0] for r in rollouts) * 1000:.0f} ms;"
                  f" to old version stopped: {statistics.median(r[1] for r in rollouts) * 1000:.0f} ms")
            print(f"requests during rollouts: {sum(r[2] for r in rollouts)}, "
                  f"failed: {sum(r[3] for r in rollouts)}")
        finally:
            for up in ups.values():
                up.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
