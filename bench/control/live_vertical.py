#!/usr/bin/python3
"""The vertical autoscaler live on real models (issue 21, item 6).

For an XGBoost model (bench/replica/run_bench.py's: 100 trees of depth 6, breast-cancer data;
--xgboost-rows rows a request over MLflow /invocations, 32 by default: with one row the
gateway and the client, on the same two cores, saturate long before the replica does) and the
llm runtime (issue 7's bench-50m, bf16, as bench/control/cold_start.py makes it; 8 prompt
tokens, 8 generated with ignore_eos over /v1/completions), both through `flotilla up`:

1. Capacity sweep of one replica: its concurrency is set by the gateway's per-replica cap (the
   target, held at each level by per_replica_concurrency {min: c, max: c}, changed in place)
   under 80 closed-loop wrk connections that keep it full: the knob the vertical policy turns,
   under the load of the convergence runs. Levels interleaved over --reps passes of --seconds
   (noise hits every level alike); per level, from the gateway: throughput (completions a
   second), mean in flight at the replica, its mean latency, p50 and p99 (the bucket bounds of
   the gateway's flotilla_gateway_replica_request_duration_seconds histogram: the replica's
   time, not the clients', which includes the wait at the gateway); medians over the passes.
   The knee: the smallest concurrency whose throughput reaches 90% of the peak (interpolated
   linearly between the two levels around it): past it, more requests in flight buy at most
   1/0.9 more throughput and cost latency in proportion.

2. Convergence: the same model on one replica (concurrency {min: 1, max: 1}: the target is
   the one replica's concurrency, and two cores shared by several replicas would not add
   capacity), autoscaled, with the per-replica target starting 4x below and 4x above the
   knee (per_replica_concurrency.initial; bounds [1, 64], the runtimes' default and the
   sweep's range: the knee is relative to the best throughput within it), under steady
   closed-loop load of 80 connections (1.25 x the max), so the replica is full at any target;
   --vertical-period-ms 5000 (DESIGN.md §4: 30 s). The target is read every second for
   --converge-seconds; reported: the final target and its ratio to the knee (within 15%?), the
   target changes, when the last one came, and the changes in the last --tail-seconds (0 when
   settled), extrapolated to an hour at the 5 s period and at the default 30 s. The vertical
   decisions' events (their reasons) are printed with --events.

Usage: bench/control/live_vertical.py [--models xgboost,llm] [--reps 3] [--seconds 5]
       [--runs 1] [--converge-seconds 240] [--tail-seconds 60] [--skip-sweep --knee M=K ...]
       (needs wrk and build/release/flotilla, or FLOTILLA_BIN)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "replica"))
import cold_start  # noqa: E402  make_llm
import live_autoscaler  # noqa: E402  Up
import run_bench  # noqa: E402  train_model

LEVELS = {"xgboost": [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64],
          "llm": [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64]}
LLM_TOKENS = 8
MAX_TARGET = 64

LUA = """
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")
"""


class Model:
    def __init__(self, runtime, path, url_path, body_file):
        self.runtime, self.path, self.url_path, self.body_file = runtime, path, url_path, body_file


def make_models(workdir, runtimes, rows):
    models = {}
    if "xgboost" in runtimes:
        path = run_bench.train_model(workdir)
        with open(os.path.join(workdir, "mlflow.json")) as f:
            row = json.load(f)["instances"][0]
        body = os.path.join(workdir, "xgboost.json")
        with open(body, "w") as f:
            json.dump({"instances": [row] * rows}, f)
        models["xgboost"] = Model("xgboost", path, "/serving-endpoints/{name}/invocations", body)
    if "llm" in runtimes:
        path = cold_start.make_llm(workdir)
        body = os.path.join(workdir, "llm.json")
        with open(body, "w") as f:
            json.dump({"model": "{name}", "prompt": list(range(100, 100 + LLM_TOKENS)),
                       "max_tokens": LLM_TOKENS, "ignore_eos": True, "temperature": 0}, f)
        models["llm"] = Model("llm", path, "/v1/completions", body)
    return models


def body_for(model, name, workdir):
    """The request body with the endpoint's name in it (the llm's OpenAI `model`)."""
    with open(model.body_file) as f:
        text = f.read().replace("{name}", name)
    path = os.path.join(workdir, f"body-{name}.json")
    with open(path, "w") as f:
        f.write(text)
    return path


def deploy(up, name, model, per_replica, autoscaled_range):
    up.call("POST", "/api/2.0/serving-endpoints", {"name": name, "served_models": [{
        "name": "v1", "model": model.path, "runtime": model.runtime,
        "concurrency": autoscaled_range, "per_replica_concurrency": per_replica}]})
    deadline = time.monotonic() + 120
    while up.view(name)["state"]["ready"] != "READY":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: not ready in 120 s")
        time.sleep(0.05)


def wrk(up, name, model, workdir, connections, seconds):
    """Starts wrk; returns the process (its output is parsed by parse_wrk)."""
    lua = os.path.join(workdir, "post.lua")
    if not os.path.exists(lua):
        with open(lua, "w") as f:
            f.write(LUA)
    url = f"http://127.0.0.1:{up.gateway_port}" + model.url_path.replace("{name}", name)
    env = {**os.environ, "BODY_FILE": body_for(model, name, workdir), "TOKEN": up.token}
    return subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "--latency",
         "-s", lua, url], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def gateway_samples(up, name):
    """The gateway's newest one-second samples of the endpoint (in flight at its replicas,
    completions, latency)."""
    request = live_autoscaler.urllib.request.Request(
        f"http://127.0.0.1:{up.gateway_port}/gateway/stats",
        headers={"Authorization": "Bearer " + up.token})
    with live_autoscaler.urllib.request.urlopen(request, timeout=30) as response:
        stats = json.loads(response.read())
    return next(e["samples"] for e in stats["endpoints"] if e["name"] == name)


def to_ms(text):
    value, unit = re.match(r"([0-9.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def parse_wrk(output):
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", output).group(1))
    p50 = to_ms(re.search(r"\s50%\s+(\S+)", output).group(1))
    p99 = to_ms(re.search(r"\s99%\s+(\S+)", output).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       output)
    failed = (int(bad.group(1)) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0)
    requests = int(re.search(r"(\d+) requests in", output).group(1))
    return {"rps": rps, "p50": p50, "p99": p99, "failed": failed, "requests": requests}


def knee_of(levels, rps, fraction=0.9):
    """The smallest concurrency whose throughput reaches `fraction` of the peak, interpolated
    linearly between the levels around it."""
    goal = fraction * max(rps)
    for i, (level, value) in enumerate(zip(levels, rps)):
        if value >= goal:
            if i == 0:
                return float(level)
            low, low_rps = levels[i - 1], rps[i - 1]
            return low + (level - low) * (goal - low_rps) / (value - low_rps)
    return float(levels[-1])


def replica_histogram(up, name):
    """The gateway's histogram of the time the endpoint's replicas took: {le: count}."""
    request = live_autoscaler.urllib.request.Request(
        f"http://127.0.0.1:{up.gateway_port}/metrics",
        headers={"Authorization": "Bearer " + up.token})
    with live_autoscaler.urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    buckets = {}
    for line in text.splitlines():
        if line.startswith("flotilla_gateway_replica_request_duration_seconds_bucket") and \
                f'endpoint="{name}"' in line:
            le = re.search(r'le="([^"]+)"', line).group(1)
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0) + float(line.rsplit(" ", 1)[1])
    return buckets


def quantile_ms(before, after, q):
    """The q-quantile of the requests between two histogram readings: the upper bound of the
    bucket it falls in, in ms."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    for bound, count in zip(bounds, counts):
        if count >= q * counts[-1]:
            return bound * 1000
    return float("inf")


def sweep(up, runtime, model, workdir, reps, seconds):
    """The replica's concurrency is swept through the gateway's per-replica cap (the target,
    fixed at each level by per_replica_concurrency {min: c, max: c}) under 80 closed-loop
    clients that keep it full: the knob the vertical policy turns, under the load the
    convergence runs put on it."""
    name = "sweep-" + runtime
    levels = LEVELS[runtime]
    spec = lambda c: {"name": name, "served_models": [{  # noqa: E731
        "name": "v1", "model": model.path, "runtime": model.runtime,
        "concurrency": {"min": 1, "max": 1}, "per_replica_concurrency": {"min": c, "max": c}}]}
    deploy(up, name, model, {"min": levels[0], "max": levels[0]}, {"min": 1, "max": 1})
    total = reps * len(levels) * (seconds + 3) + 30
    load = wrk(up, name, model, workdir, round(1.25 * MAX_TARGET), total)
    runs = {level: [] for level in levels}
    time.sleep(2)  # warm up
    for _ in range(reps):
        for level in levels:
            up.call("PUT", f"/api/2.0/serving-endpoints/{name}/config", spec(level))
            while up.view(name)["autoscaler"]["target_concurrency"] != level:
                time.sleep(0.05)
            time.sleep(1.5)  # the cap applies to requests dispatched from now on
            before, start = replica_histogram(up, name), time.time()
            time.sleep(seconds)
            after, end = replica_histogram(up, name), time.time()
            samples = [s for s in gateway_samples(up, name)
                       if start * 1000 + 1000 <= s["unix_ms"] <= end * 1000]
            completions = sum(s["completions"] for s in samples)
            runs[level].append({
                "rps": completions / max(1, len(samples)),
                "in_flight": statistics.mean(s["concurrency"] for s in samples),
                "latency": sum(s["latency_ms"] * s["completions"] for s in samples) /
                           max(1, completions),
                "p50": quantile_ms(before, after, 0.5), "p99": quantile_ms(before, after, 0.99)})
    load.terminate()
    load.communicate()
    up.call("DELETE", "/api/2.0/serving-endpoints/" + name)
    rows = []
    for level in levels:
        rps = [r["rps"] for r in runs[level]]
        rows.append({"c": level, "rps": statistics.median(rps),
                     "spread": (max(rps) - min(rps)) / max(1e-9, statistics.median(rps)),
                     **{k: statistics.median(r[k] for r in runs[level])
                        for k in ("in_flight", "latency", "p50", "p99")}})
    knee = knee_of(levels, [r["rps"] for r in rows])
    peak = max(r["rps"] for r in rows)
    print(f"\n== capacity sweep: {runtime}, one replica, its cap at each level under "
          f"{round(1.25 * MAX_TARGET)} clients, {reps} passes of {seconds} s (medians)")
    print(f"{'cap':>5}{'in flight':>10}{'req/s':>9}{'% peak':>8}{'mean ms':>9}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'spread':>8}")
    for r in rows:
        print(f"{r['c']:>5}{r['in_flight']:>10.1f}{r['rps']:>9.1f}{100 * r['rps'] / peak:>7.0f}%"
              f"{r['latency']:>9.2f}{r['p50']:>9.2f}{r['p99']:>9.2f}{100 * r['spread']:>7.0f}%")
    print(f"knee (the smallest cap at 90% of the peak {peak:.1f} req/s): {knee:.1f}")
    sys.stdout.flush()
    return knee, rows


def converge(up, runtime, model, workdir, knee, factor, seconds, tail, run):
    name = f"v-{runtime}-{'low' if factor < 1 else 'high'}-{run}"
    start = min(MAX_TARGET, max(1, round(knee * factor)))
    deploy(up, name, model, {"min": 1, "max": MAX_TARGET, "initial": start}, {"min": 1, "max": 1})
    connections = round(1.25 * MAX_TARGET)
    load = wrk(up, name, model, workdir, connections, seconds + 5)
    t0 = time.monotonic()
    readings = []  # (seconds, target)
    while time.monotonic() < t0 + seconds:
        readings.append((time.monotonic() - t0,
                         up.view(name)["autoscaler"]["target_concurrency"]))
        time.sleep(1.0)
    out = parse_wrk(load.communicate()[0])
    events = [e["message"] for e in up.call(
        "GET", f"/api/2.0/serving-endpoints/{name}/events?limit=200")["events"]
        if e["message"].startswith("vertical")]
    up.call("DELETE", "/api/2.0/serving-endpoints/" + name)
    changes = [(t, b) for (_, a), (t, b) in zip(readings, readings[1:]) if b != a]
    final = readings[-1][1]
    in_tail = [c for c in changes if c[0] >= seconds - tail]
    trail = [f"{readings[0][1]:.4g}"] + [f"{b:.4g}" for _, b in changes]
    return {"runtime": runtime, "factor": factor, "start": start, "final": final,
            "ratio": final / knee, "changes": len(changes),
            "last_change_s": changes[-1][0] if changes else 0.0, "tail_changes": len(in_tail),
            "connections": connections, "failed": out["failed"], "requests": out["requests"],
            "trail": " ".join(trail), "events": events}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="xgboost,llm")
    parser.add_argument("--reps", type=int, default=3, help="sweep passes")
    parser.add_argument("--seconds", type=int, default=5, help="seconds a sweep level")
    parser.add_argument("--runs", type=int, default=1, help="convergence runs per start")
    parser.add_argument("--converge-seconds", type=int, default=240)
    parser.add_argument("--tail-seconds", type=int, default=60)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-converge", action="store_true")
    parser.add_argument("--events", action="store_true", help="print the vertical events")
    parser.add_argument("--xgboost-rows", type=int, default=32,
                        help="rows in one xgboost request")
    parser.add_argument("--knee", action="append", default=[],
                        help="RUNTIME=CONCURRENCY: use this knee instead of sweeping")
    args = parser.parse_args()
    runtimes = [m for m in args.models.split(",") if m]
    if any(m not in LEVELS for m in runtimes):
        parser.error("--models: a comma-separated list of xgboost, llm")
    knees = {k: float(v) for k, v in (item.split("=") for item in args.knee)}

    with tempfile.TemporaryDirectory() as workdir:
        models = make_models(workdir, runtimes, args.xgboost_rows)
        up = live_autoscaler.Up(os.path.join(workdir, "data"), "--vertical-period-ms", "5000",
                                "--scale-down-window-ms", "30000")
        try:
            for runtime in runtimes:
                if not args.skip_sweep:
                    knees[runtime], _ = sweep(up, runtime, models[runtime], workdir, args.reps,
                                              args.seconds)
            if args.skip_converge:
                return 0
            results = []
            for run in range(args.runs):
                for runtime in runtimes:
                    for factor in (0.25, 4.0):
                        results.append(converge(up, runtime, models[runtime], workdir,
                                                knees[runtime], factor, args.converge_seconds,
                                                args.tail_seconds, run))
                        r = results[-1]
                        print(f"  {runtime} x{factor:g} run {run}: {r['trail']}", flush=True)
                        if args.events:
                            for event in r["events"]:
                                print("    " + event)
        finally:
            up.stop()
    print(f"\n== convergence: one replica, target from 4x below / above the knee, "
          f"{args.converge_seconds} s, vertical period 5 s")
    print(f"{'model':<8}{'start':>7}{'knee':>7}{'final':>8}{'ratio':>7}{'<=15%':>7}"
          f"{'changes':>9}{'last s':>8}{'tail':>6}{'/h@5s':>7}{'/h@30s':>8}{'failed':>8}")
    for r in results:
        knee = knees[r["runtime"]]
        ok = abs(r["ratio"] - 1) <= 0.15
        per_hour = r["tail_changes"] * 3600 / args.tail_seconds
        print(f"{r['runtime']:<8}{r['start']:>7}{knee:>7.1f}{r['final']:>8.2f}{r['ratio']:>7.2f}"
              f"{'yes' if ok else 'NO':>7}{r['changes']:>9}{r['last_change_s']:>8.0f}"
              f"{r['tail_changes']:>6}{per_hour:>7.0f}{per_hour / 6:>8.0f}"
              f"{r['failed']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
