#!/usr/bin/python3
"""Kubernetes mode against `flotilla up` (issue #20), in one run, through the same REST API.

Both serve the same real XGBoost model (the iris classifier, MLflow directory) and are driven
by the same calls to /api/2.0/serving-endpoints; only what is behind the API differs:

- local: `flotilla up --warm-pool 1 --no-autoscale` (replica processes, a warm pool);
- cluster: `flotilla controller --no-autoscale` and `flotilla gateway --kubernetes` on the
  FAKE API server and FAKE kubelet of tests/fakes/kubernetes (no Kubernetes runs on these
  machines), the kubelet keeping the pod template's own probe timings (readiness every
  periodSeconds), so each pod is a real `flotilla replica` process started on a Deployment's
  say and routed once its EndpointSlice says ready. What a real cluster adds is not measured:
  scheduling, image pulls, container creation.

Per run and mode: apply → the first 200 through the gateway; a scale-up decision (concurrency.min
1 → 16, at 4 per replica: 1 → 4 replicas) → 4 ready in the endpoint's view; a rollout to a new
version under 4 closed-loop clients → traffic switched, with the failed requests (must be 0).
Runs alternate between the modes; medians and the cluster ÷ local ratio are printed.

Usage: bench/kubernetes/local_vs_cluster.py [--runs 3]   (needs build/release/flotilla)
"""
import argparse
import base64
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.path.abspath(os.environ.get("FLOTILLA_BIN",
                                          os.path.join(ROOT, "build/release/flotilla")))
sys.path.insert(0, os.path.join(ROOT, "tests", "fakes", "kubernetes"))

sys.path.insert(0, os.path.join(ROOT, "bench", "control"))

import cold_start  # noqa: E402  (its `flotilla up` wrapper)
import fake_apiserver  # noqa: E402
import fake_kubelet  # noqa: E402

NS = "bench"
BODY = json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]})


def listening_port(process, what):
    line = process.stdout.readline()
    match = re.search(r'"port":\s*(\d+)', line)
    if not match:
        raise RuntimeError(f"{what} did not start: {line!r}")
    return int(match.group(1))


class Local(cold_start.Up):
    """`flotilla up` with a warm pool of one, as bench/control/cold_start.py starts it."""
    name = "local (flotilla up)"

    def __init__(self, workdir):
        super().__init__(workdir, warm_pool=1)


class Cluster:
    name = "cluster (controller + gateway --kubernetes, fake kubelet)"
    call = cold_start.Up.call  # the same API calls, to the controller

    def __init__(self, workdir):
        self.apiserver = fake_apiserver.FakeApiServer(port=0)
        self.apiserver.start()
        kubeconfig = self.apiserver.write_kubeconfig(os.path.join(workdir, "kubeconfig"), NS)
        # probe_period_s=None: the template's probe periods, as a kubelet runs them.
        self.kubelet = fake_kubelet.FakeKubelet(self.apiserver, {"flotilla": FLOTILLA},
                                                probe_period_s=None,
                                                log_dir=os.path.join(workdir, "pods"))
        self.kubelet.start()
        self.processes = []
        controller = self.start([FLOTILLA, "controller", "--kubeconfig", kubeconfig,
                                 "--api-addr", "127.0.0.1:0", "--no-autoscale",
                                 "--log-level", "warn"], "flotilla controller")
        gateway = self.start([FLOTILLA, "gateway", "--kubernetes", "--kubeconfig", kubeconfig,
                              "--listen", "127.0.0.1:0", "--log-level", "warn"],
                             "flotilla gateway")
        self.api = f"http://127.0.0.1:{controller}"
        self.gateway = f"http://127.0.0.1:{gateway}"
        deadline = time.monotonic() + 30
        while self.apiserver.get("secrets", NS, "flotilla-admin-token") is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the controller minted no admin token")
            time.sleep(0.05)
        secret = self.apiserver.get("secrets", NS, "flotilla-admin-token")
        self.token = base64.b64decode(secret["data"]["token"]).decode()

    def start(self, argv, what):
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)
        self.processes.append(process)
        return listening_port(process, what)

    def stop(self):
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            process.wait(timeout=60)
        self.kubelet.stop()
        self.apiserver.stop()


def wait(mode, name, predicate, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate(mode.call("GET", "/api/2.0/serving-endpoints/" + name)):
                return
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
        time.sleep(0.01)
    raise RuntimeError(f"{mode.name}: {name}: condition not met in {timeout} s")


def infer(mode, name):
    host, port = mode.gateway[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", f"/serving-endpoints/{name}/invocations", body=BODY,
                     headers={"Authorization": "Bearer " + mode.token,
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        return 0
    finally:
        conn.close()


def spec(name, model, version="v1", min_concurrency=1):
    return {"name": name, "served_models": [{
        "name": version, "model": model, "concurrency": {"min": min_concurrency, "max": 64},
        "per_replica_concurrency": {"min": 4, "max": 4}}]}


def ready_replicas(view, version):
    return sum(v["replicas_ready"] for v in view["versions"] if v["name"] == version)


def run_once(mode, model, index, workdir):
    name = f"bench{index}"
    start = time.monotonic()
    mode.call("POST", "/api/2.0/serving-endpoints", spec(name, model))
    while infer(mode, name) != 200:
        if time.monotonic() - start > 120:
            raise RuntimeError(f"{mode.name}: {name} never answered")
        time.sleep(0.01)
    first_ok = time.monotonic() - start

    start = time.monotonic()
    mode.call("PUT", f"/api/2.0/serving-endpoints/{name}/config",
         spec(name, model, min_concurrency=16))
    wait(mode, name, lambda v: ready_replicas(v, "v1") >= 4)
    scaled = time.monotonic() - start

    stop_file = os.path.join(workdir, f"stop-{mode.__class__.__name__}-{index}")
    load = subprocess.Popen(
        ["/usr/bin/python3", os.path.join(ROOT, "scripts/load_client.py"), "--url",
         f"{mode.gateway}/serving-endpoints/{name}/invocations", "--token", mode.token,
         "--body", BODY, "--threads", "4", "--stop-file", stop_file],
        stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    start = time.monotonic()
    mode.call("PUT", f"/api/2.0/serving-endpoints/{name}/config",
         spec(name, model, version="v2", min_concurrency=16))
    wait(mode, name, lambda v: v["state"]["config_update"] == "NOT_UPDATING" and
         ready_replicas(v, "v2") >= 4)
    switched = time.monotonic() - start
    time.sleep(0.5)
    open(stop_file, "w").close()
    counts = json.loads(load.communicate(timeout=60)[0])
    mode.call("DELETE", f"/api/2.0/serving-endpoints/{name}")
    return first_ok, scaled, switched, counts["requests"], counts["failed"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_models.py"),
                        workdir], check=True, stdout=subprocess.DEVNULL)
        model = os.path.join(workdir, "mlflow_classifier")
        modes = [Local(workdir), Cluster(workdir)]
        results = {mode.name: [] for mode in modes}
        try:
            for index in range(args.runs):
                for mode in modes:
                    results[mode.name].append(run_once(mode, model, index, workdir))
                    print(f"{mode.name}, run {index + 1}: " + ", ".join(
                        f"{x:.3f}" if isinstance(x, float) else str(x)
                        for x in results[mode.name][-1]), file=sys.stderr)
        finally:
            for mode in modes:
                mode.stop()
    print("| mode | apply → first 200 (s) | 1 → 4 replicas ready (s) | rollout: switched (s) "
          "| requests / failed |")
    print("|---|---|---|---|---|")
    medians = {}
    for name, runs in results.items():
        medians[name] = [statistics.median(r[i] for r in runs) for i in range(3)]
        requests = sum(r[3] for r in runs)
        failed = sum(r[4] for r in runs)
        print(f"| {name} | {medians[name][0]:.3f} | {medians[name][1]:.3f} | "
              f"{medians[name][2]:.3f} | {requests} / {failed} |")
    local, cluster = (medians[m.name] for m in modes)
    print(f"| **cluster ÷ local** | **{cluster[0] / local[0]:.1f}x** | "
          f"**{cluster[1] / local[1]:.1f}x** | **{cluster[2] / local[2]:.1f}x** | |")
    print(f"\nmedians of {args.runs} runs per mode, alternated")


if __name__ == "__main__":
    main()
