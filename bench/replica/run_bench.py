#!/usr/bin/python3
"""Replica benchmark: flotilla replica vs the raw libxgboost predict and a Python server.

    /usr/bin/python3 bench/replica/run_bench.py [--duration 5] [--reps 3] [--conns 1,16,64]

Builds nothing: run `bash scripts/build.sh release` first. Trains the benchmark model (an
XGBoost binary:logistic classifier, 100 trees of depth 6, on scikit-learn's breast-cancer
data: 30 features), then measures in one run, on the same cores:

  raw        the in-process limit: bench/xgboost_predict_bench (Google Benchmark), one row
  live       flotilla's GET /v2/health/live at c=1: the HTTP round trip with no model
  flotilla   `flotilla replica --workers 1`, dynamic batching on (the default)
  nobatch    the same with --no-batching
  delayNNN   the same with --max-queue-delay-us NNN (at the highest concurrency only)
  *-2w       flotilla and nobatch with --workers 2, unpinned (wrk shares the cores)
  python     bench/replica/python_server.py: aiohttp + python3-xgboost inplace_predict, the
             stand-in for MLflow's Python scoring server

Load: wrk -t1 with single-row Open Inference Protocol requests (and MLflow `instances` for
flotilla and python at the highest concurrency). With 2+ CPUs, wrk runs on cpu0 and the
server on cpu1, so every server gets exactly one core. Runs are interleaved across servers
and repeated; medians are reported. Prints a markdown table and the ratios.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build", "release")
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(BUILD, "flotilla"))
PREDICT_BENCH = os.path.join(BUILD, "bench", "xgboost_predict_bench")
PYTHON_SERVER = os.path.join(ROOT, "bench", "replica", "python_server.py")
LUA = os.path.join(ROOT, "bench", "replica", "post_oip.lua")


def pin(cpu):
    return ["taskset", "-c", str(cpu)] if (os.cpu_count() or 1) >= 2 else []


def train_model(directory):
    import numpy as np
    import xgboost as xgb
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.1, "nthread": 1,
              "seed": 0}
    booster = xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=100)
    path = os.path.join(directory, "bench.json")
    booster.save_model(path)
    row = X[0].astype(np.float32).tolist()
    oip = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 30], "data": row}]}
    mlflow = {"instances": [row]}
    for name, body in (("oip.json", oip), ("mlflow.json", mlflow)):
        with open(os.path.join(directory, name), "w") as f:
            json.dump(body, f)
    return path


def raw_predict_us(model):
    out = subprocess.run(
        [*pin(1), PREDICT_BENCH, "--benchmark_filter=BM_(RawPredict|RawPredictNoProxy|RuntimePredict)/1$",
         "--benchmark_format=json", "--benchmark_repetitions=5",
         "--benchmark_report_aggregates_only=true"],
        env={**os.environ, "FLOTILLA_BENCH_MODEL": model}, capture_output=True, text=True,
        check=True)
    medians = {}
    for bench in json.loads(out.stdout)["benchmarks"]:
        if bench.get("aggregate_name") == "median":
            medians[bench["run_name"]] = bench["real_time"] / 1000.0  # ns -> us
    return medians


class Server:
    def __init__(self, name, argv, ready_pattern):
        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        line = self.proc.stdout.readline()
        match = re.search(ready_pattern, line)
        if not match:
            self.stop()
            raise RuntimeError(f"{name} did not start: {line!r}")
        self.port = int(match.group(1))

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_servers(model):
    def flotilla(name, *extra, workers=1):
        pinning = pin(1) if workers == 1 else []
        return Server(name, [*pinning, FLOTILLA, "replica", "--model", model, "--name", "bench",
                             "--workers", str(workers), "--log-level", "warn", *extra],
                      r'"port":(\d+)')
    return {
        "flotilla": flotilla("flotilla"),
        "nobatch": flotilla("nobatch", "--no-batching"),
        "flotilla-2w": flotilla("flotilla-2w", workers=2),
        "nobatch-2w": flotilla("nobatch-2w", "--no-batching", workers=2),
        "delay100": flotilla("delay100", "--max-queue-delay-us", "100"),
        "delay500": flotilla("delay500", "--max-queue-delay-us", "500"),
        "python": Server("python", [*pin(1), "/usr/bin/python3", PYTHON_SERVER, "--model", model,
                                    "--name", "bench"], r"listening (\d+)"),
    }


def to_us(text):
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 1, "ms": 1000, "s": 1e6, "m": 6e7}[unit]


def wrk(port, path, body, conns, duration, pinned=True):
    """POSTs `body` (a file) to `path`, or GETs `path` when body is None."""
    script = ["-s", LUA] if body else []
    out = subprocess.run(
        [*(pin(0) if pinned else []), "wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", *script,
         f"http://127.0.0.1:{port}{path}"],
        env={**os.environ, "BODY_FILE": body or ""}, capture_output=True, text=True,
        check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    if errors or socket_errors:
        raise RuntimeError(f"wrk saw errors on port {port}{path}:\n{out}")
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": to_us(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),
        "p99": to_us(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--conns", default="1,16,64", help="wrk connection counts")
    args = parser.parse_args()
    for tool in (FLOTILLA, PREDICT_BENCH):
        if not os.path.exists(tool):
            sys.exit(f"{tool} is missing: run `bash scripts/build.sh release` first")
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: run `bash scripts/setup.sh`")
    conns = [int(c) for c in args.conns.split(",")]
    top = max(conns)

    workdir = tempfile.mkdtemp(prefix="flotilla-bench-")
    model = train_model(workdir)
    raw = raw_predict_us(model)
    oip_body = os.path.join(workdir, "oip.json")
    mlflow_body = os.path.join(workdir, "mlflow.json")

    # (server, protocol, conns) cells, each measured `reps` times, interleaved.
    cells = [(s, "oip", c) for c in conns for s in ("flotilla", "nobatch", "python")]
    cells += [("flotilla", "live", 1)]  # the HTTP round trip alone: no body, no model
    cells += [(s, "oip", top) for s in ("delay100", "delay500")]
    cells += [(s, "mlflow", top) for s in ("flotilla", "python")]
    # Two workers, nothing pinned: server and wrk share both cores.
    cells += [(s, "oip", top) for s in ("flotilla-2w", "nobatch-2w")]
    samples = {cell: [] for cell in cells}
    servers = start_servers(model)
    try:
        for _ in range(args.reps):
            for cell in cells:
                server, protocol, c = cell
                port = servers[server].port
                if protocol == "oip":
                    result = wrk(port, "/v2/models/bench/infer", oip_body, c, args.duration,
                                 pinned=not server.endswith("-2w"))
                elif protocol == "live":
                    result = wrk(port, "/v2/health/live", None, c, args.duration)
                else:
                    result = wrk(port, "/invocations", mlflow_body, c, args.duration)
                samples[cell].append(result)
                time.sleep(0.5)  # let the server finish the previous run's backlog
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def median(cell, key):
        return statistics.median(r[key] for r in samples[cell])

    raw1 = raw["BM_RawPredict/1"]
    print(f"raw libxgboost predict, 1 row (median of 5): {raw1:.1f} us with a reused proxy "
          f"DMatrix, {raw['BM_RawPredictNoProxy/1']:.1f} us without; through the xgboost "
          f"runtime {raw['BM_RuntimePredict/1']:.1f} us")
    print()
    print("| server | protocol | conns | req/s | p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|")
    for cell in cells:
        server, protocol, c = cell
        print(f"| {server} | {protocol} | {c} | {median(cell, 'rps'):,.0f} | "
              f"{median(cell, 'p50'):,.0f} | {median(cell, 'p99'):,.0f} |")
    print()
    for c in conns:
        ratio = median(("flotilla", "oip", c), "rps") / median(("python", "oip", c), "rps")
        print(f"throughput flotilla/python at c={c}: {ratio:.1f}x")
    ratio = median(("flotilla", "mlflow", top), "rps") / median(("python", "mlflow", top), "rps")
    print(f"throughput flotilla/python at c={top}, MLflow /invocations: {ratio:.1f}x")
    if 1 in conns:
        overhead = median(("flotilla", "oip", 1), "p50") - raw1
        live = median(("flotilla", "live", 1), "p50")
        print(f"p50 overhead over the raw predict at c=1: {overhead:.0f} us "
              f"(wrk p50 {median(('flotilla', 'oip', 1), 'p50'):.0f} us - raw {raw1:.1f} us; "
              f"includes wrk and loopback TCP: a GET /v2/health/live round trip is {live:.0f} us)")
    gain = median(("flotilla", "oip", top), "rps") / median(("nobatch", "oip", top), "rps")
    print(f"dynamic batching at c={top}: {gain:.2f}x the throughput of --no-batching")
    gain2 = (median(("flotilla-2w", "oip", top), "rps") /
             median(("nobatch-2w", "oip", top), "rps"))
    print(f"dynamic batching at c={top} with 2 workers, unpinned: {gain2:.2f}x")


if __name__ == "__main__":
    main()
