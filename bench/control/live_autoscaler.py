#!/usr/bin/python3
"""The autoscaler's live loop in `flotilla up` on real processes (issue #5).

Horizontal: a synthetic model (50 ms a request, per-replica target fixed at 4) under a load
step from 2 to 24 closed-loop clients, then no load. Prints per second the clients' p99, the
ready replicas and errors, and the step's figures: time to the first scale-up, time to the
replicas 24 clients need (6), p99 in the 10 s after the step, and when the scale-down started
after the load stopped. Defaults of DESIGN.md §4 (5 s decisions, 20 s up window) except the down
window, shortened from 300 s to 30 s to keep the run short.

Vertical: a synthetic model whose latency is flat up to 12 requests in flight per replica and
grows in proportion beyond, under 40 clients; the per-replica target starts at the synthetic
runtime's default (8) and is printed each decision period (shortened from 30 s to 5 s); the
result is compared with the true saturation point.

Queueing: a synthetic model that serves 6 requests at once per replica and queues the rest
inside (max_concurrency), so latency grows by 1/6 per queued request and stays under the 1.5x
overload threshold until 3 queue: only the replicas' queue (flotilla_replica_queue_wait_seconds_total)
shows the overload. Same 40 clients, target printed each period, compared with the 6 slots.

Usage: bench/control/live_autoscaler.py   (needs build/release/flotilla; about 4 minutes)
"""
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build/release/flotilla"))


class Up:
    def __init__(self, data_dir, *flags):
        self.process = subprocess.Popen(
            [FLOTILLA, "up", "--data-dir", data_dir, "--gateway-addr", "127.0.0.1:0",
             "--api-addr", "127.0.0.1:0", "--grpc-addr", "off", "--log-level", "warn", *flags],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        match = re.search(r"gateway http://([0-9.]+):(\d+), api (http://[0-9.:]+)",
                          self.process.stdout.readline())
        self.gateway_port, self.api = int(match.group(2)), match.group(3)
        with open(os.path.join(data_dir, "admin.token")) as f:
            self.token = f.read().strip()

    def call(self, method, path, body=None):
        request = urllib.request.Request(
            self.api + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + self.token,
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def view(self, name):
        return self.call("GET", "/api/2.0/serving-endpoints/" + name)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


class Clients:
    """`count` closed-loop clients; latencies and errors kept per second of wall time."""

    def __init__(self, up, name, count):
        self.up, self.name, self.stop_flag = up, name, threading.Event()
        self.lock = threading.Lock()
        self.latencies = {}  # second -> [ms]
        self.errors = {}     # second -> count
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.up.gateway_port, timeout=30)
        body = json.dumps({"instances": [[1.0]]})
        headers = {"Authorization": "Bearer " + self.up.token,
                   "Content-Type": "application/json"}
        while not self.stop_flag.is_set():
            start = time.time()
            try:
                connection.request("POST", f"/serving-endpoints/{self.name}/invocations",
                                   body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.up.gateway_port,
                                                        timeout=30)
                ok = False
            second = int(start)
            with self.lock:
                if ok:
                    self.latencies.setdefault(second, []).append((time.time() - start) * 1000)
                else:
                    self.errors[second] = self.errors.get(second, 0) + 1

    def stop(self):
        self.stop_flag.set()
        for thread in self.threads:
            thread.join(60)


def p99(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.99))] if values else 0.0


def synthetic(workdir, name, saturation, max_concurrency=0):
    path = os.path.join(workdir, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"service_time: {{dist: fixed, mean_ms: 50}}\ncpu_us: 0\n"
                f"saturation: {saturation}\nmax_concurrency: {max_concurrency}\nseed: 1\n")
    return path


def deploy(up, name, model, concurrency, per_replica):
    """Creates a one-version synthetic endpoint and waits until it serves."""
    up.call("POST", "/api/2.0/serving-endpoints", {"name": name, "served_models": [{
        "name": "v1", "model": model, "runtime": "synthetic", "concurrency": concurrency,
        "per_replica_concurrency": per_replica}]})
    while up.view(name)["state"]["ready"] != "READY":
        time.sleep(0.05)


def ready(view):
    return sum(r["state"] == "ready" for r in view["replicas"])


def horizontal(up, workdir):
    name = "step"
    deploy(up, name, synthetic(workdir, name, 100000), {"min": 1, "max": 64}, {"min": 4, "max": 4})
    timeline = []  # (second, ready replicas)
    phases = [(2, 10), (24, 30), (0, 50)]
    clients_by_phase = []
    t0 = time.time()
    step_at = t0 + phases[0][1]
    load_end = step_at + phases[1][1]
    for count, seconds in phases:
        clients = Clients(up, name, count) if count else None
        end = time.time() + seconds
        while time.time() < end:
            timeline.append((time.time(), ready(up.view(name))))
            time.sleep(0.1)
        if clients:
            clients.stop()
            clients_by_phase.append(clients)
    latencies, errors = {}, {}
    for clients in clients_by_phase:
        for second, values in clients.latencies.items():
            latencies.setdefault(second, []).extend(values)
        for second, count in clients.errors.items():
            errors[second] = errors.get(second, 0) + count

    print("== horizontal: 2 clients for 10 s, 24 for 30 s, then none (synthetic 50 ms, target 4)")
    print(f"{'t s':>5}{'clients':>9}{'ready':>7}{'req/s':>7}{'p99 ms':>8}{'errors':>8}")
    for second in range(int(t0), int(load_end) + 50):
        rel = second - int(t0)
        replicas = [r for t, r in timeline if int(t) == second]
        clients = 2 if second < step_at else 24 if second < load_end else 0
        values = latencies.get(second, [])
        if rel % 2 == 0 or second in (int(step_at), int(load_end)):
            print(f"{rel:>5}{clients:>9}{(replicas[-1] if replicas else 0):>7}{len(values):>7}"
                  f"{p99(values):>8.0f}{errors.get(second, 0):>8}")
    first_up = next((t for t, r in timeline if t > step_at and r > 1), None)
    enough = next((t for t, r in timeline if t > step_at and r >= 6), None)
    first_down = next((t for t, r in timeline if t > load_end and r < 6), None)
    step_second = int(step_at)  # requests are keyed by the second they started in
    after_step = [v for s, vs in latencies.items() if step_second <= s < step_second + 10
                  for v in vs]
    before_step = [v for s, vs in latencies.items() if s < step_second for v in vs]
    print(f"step to a second replica ready: {first_up - step_at:.1f} s; to 6 ready: "
          f"{enough - step_at:.1f} s" if first_up and enough else "did not scale up")
    print(f"p99 before the step {p99(before_step):.0f} ms; in the 10 s after it "
          f"{p99(after_step):.0f} ms; errors {sum(errors.values())}")
    print(f"load stopped to the first replica removed: {first_down - load_end:.1f} s "
          f"(down window 30 s)" if first_down else "no scale-down within 50 s")


def vertical(up, workdir, name, model, truth, what):
    deploy(up, name, model, {"min": 1, "max": 24}, {"min": 1, "max": 32})
    clients = Clients(up, name, 40)
    print(f"\n== vertical: 40 clients; {what}")
    print(f"{'t s':>5}{'target':>8}{'ready':>7}")
    t0 = time.time()
    targets = []
    while time.time() < t0 + 75:
        view = up.view(name)
        targets.append(view["autoscaler"]["target_concurrency"])
        print(f"{time.time() - t0:>5.0f}{targets[-1]:>8.2f}{ready(view):>7}")
        time.sleep(5)
    clients.stop()
    final = statistics.median(targets[-4:])
    print(f"learned target (median of the last 4 readings) {final:.2f} vs {truth}: "
          f"{final / truth:.2f}x; errors {sum(clients.errors.values())}")


def main():
    with tempfile.TemporaryDirectory() as workdir:
        up = Up(os.path.join(workdir, "data"), "--scale-down-window-ms", "30000",
                "--vertical-period-ms", "5000")
        try:
            horizontal(up, workdir)
            vertical(up, workdir, "learn", synthetic(workdir, "learn", 12), 12,
                     "latency flat up to 12 in flight per replica")
            vertical(up, workdir, "queue", synthetic(workdir, "queue", 100000, 6), 6,
                     "6 served at once per replica, the rest queued inside")
        finally:
            up.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
