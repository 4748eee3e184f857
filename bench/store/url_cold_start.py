#!/usr/bin/python3
"""Time to first request for a replica whose model is an http:// URL: not cached (pulled in
parallel ranges), cached (a second replica on the same data directory), and what a DIY setup
does instead (curl the file, then start the replica on the local copy), in one run (issue #6).

The model is an XGBoost regressor trained here (python3-xgboost), large enough for the
download to matter, served by nginx on 127.0.0.1 with `limit_rate` per connection (a remote
object store). The clock runs from exec to the first successful /invocations answer.

    /usr/bin/python3 bench/store/url_cold_start.py [--rounds 1500] [--rate-mib 16] [--runs 3]
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pull_bench import make_dirs, start_nginx, stop_nginx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build/release/flotilla"))


def train(path, rounds):
    code = f"""
import numpy as np, xgboost as xgb
rng = np.random.default_rng(1)
x = rng.normal(size=(20000, 16)); y = x[:, 0] * 3 + np.sin(x[:, 1]) + rng.normal(size=20000)
booster = xgb.train({{"max_depth": 8, "eta": 0.05, "nthread": 2}}, xgb.DMatrix(x, label=y),
                    num_boost_round={rounds})
booster.save_model({path!r})
"""
    subprocess.run(["/usr/bin/python3", "-c", code], check=True)


def first_request_seconds(argv, path="/invocations", request=None):
    """Starts a replica (port 0), waits for its listening line, then for a 200 from POST `path`
    (default: /invocations with one row of 16 features); returns seconds from exec, and stops
    the replica."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"replica exited: {argv}")
        port = json.loads(line)["port"]
        body = json.dumps(request or {"instances": [[0.1] * 16]})
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            if conn.getresponse().status == 200:
                return time.monotonic() - start
            time.sleep(0.001)
    finally:
        proc.terminate()
        proc.wait(10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--rate-mib", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    work, www = make_dirs()
    model = os.path.join(www, "model.json")
    train(model, args.rounds)
    os.chmod(model, 0o644)
    size_mib = os.path.getsize(model) / 2**20
    nginx, port = start_nginx(www, work, args.rate_mib)
    url = f"http://127.0.0.1:{port}/limited/model.json"
    replica = [FLOTILLA, "replica", "--port", "0", "--log-level", "warn", "--runtime", "xgboost"]
    try:
        uncached, cached, diy = [], [], []
        for _ in range(args.runs):
            cache = os.path.join(work, "cache")
            uncached.append(first_request_seconds(replica + ["--model", url, "--cache-dir", cache]))
            cached.append(first_request_seconds(replica + ["--model", url, "--cache-dir", cache]))
            shutil.rmtree(cache)
            local = os.path.join(work, "model.json")
            start = time.monotonic()
            subprocess.run(["curl", "-sf", "-o", local, url], check=True)
            diy.append(time.monotonic() - start + first_request_seconds(replica +
                                                                        ["--model", local]))
            os.remove(local)
        u, c, d = (statistics.median(x) for x in (uncached, cached, diy))
        print(f"XGBoost model of {size_mib:.0f} MiB ({args.rounds} trees) from nginx at "
              f"{args.rate_mib} MiB/s per connection; exec to first 200, median of {args.runs}")
        print(f"{'':42} {'seconds':>8} {'vs curl + replica':>18}")
        print(f"{'curl, then flotilla replica on the file':42} {d:8.2f} {1:17.2f}x")
        print(f"{'flotilla replica --model URL, not cached':42} {u:8.2f} {d / u:17.2f}x")
        print(f"{'flotilla replica --model URL, cached':42} {c:8.2f} {d / c:17.2f}x")
        print(f"cached vs not cached: {u / c:.1f}x faster to the first request")
    finally:
        stop_nginx(nginx, work)


if __name__ == "__main__":
    main()
