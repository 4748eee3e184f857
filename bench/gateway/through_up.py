#!/usr/bin/python3
"""The gateway through the platform (issue #25 item 3): `flotilla up` with auth on, serving a
real XGBoost model on 4 replicas, against nginx (`random two least_conn`, the peers' config)
proxying to the same 4 replica processes, in one run.

`flotilla up --no-autoscale` serves the iris classifier (tests/fixtures/make_models.py) on 4
replicas (concurrency.min 128 at 32 a replica); every request carries the endpoint's bearer
token, which flotilla checks (nginx, like most proxies in front of a model server, is given the
same header and checks nothing). nginx is rendered from ../shared/bench/peers' template with as
many workers as flotilla's gateway has event loops (--workers, default 1; `up
--gateway-workers` the same) and upstream keep-alive 64. The load is wrk (-t1, -c each of
--conns) with the peers' 4-feature JSON POST to /serving-endpoints/iris/invocations; nginx maps
that path to the replicas' /invocations. Nothing is pinned: the replicas, both proxies and wrk
share the machine, as they do in a deployment on one host. Runs alternate flotilla, nginx,
nginx, flotilla, ... (--reps pairs of --seconds each); prints each run, then per connection
count the median req/s, p99 and the ratio flotilla / nginx per pair and its median. CPU-µs per
request from /proc (utime + stime over the run): the proxy's (`flotilla up` is one process, its
control plane's threads count too; nginx's master and workers) and the 4 replicas'; `busy` is
the share of the machine's CPU time not idle.

Usage: bench/gateway/through_up.py [--reps 5] [--seconds 10] [--conns 16,64] [--workers 1]
                                  [--balancer p2c]
       (needs build/release/flotilla or FLOTILLA_BIN, nginx and wrk: bash scripts/setup.sh)
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "control"))
import cold_start  # noqa: E402  (its Up: one `flotilla up` on free ports)

PEERS = os.path.join(ROOT, "..", "shared", "bench", "peers")
BODY = '{"instances":[[0.1,0.2,0.3,0.4]]}'
PATH = "/serving-endpoints/iris/invocations"
NGINX_PORT = 18180
REPLICAS = 4
TICKS = os.sysconf("SC_CLK_TCK")


def wrk_script(workdir, token):
    path = os.path.join(workdir, "post.lua")
    with open(path, "w") as f:
        f.write(f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
done = function(summary, latency, requests)
  local s = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format("RESULT rps=%.1f p99_us=%d reqs=%d errors=%d non2xx=%d\\n",
    summary.requests / s, latency:percentile(99), summary.requests,
    e.connect + e.read + e.write + e.timeout, e.status))
end
""")
    return path


def nginx_config(workdir, addresses, workers):
    with open(os.path.join(PEERS, "conf", "nginx-proxy.conf.tmpl")) as f:
        text = f.read()
    servers = "\n".join(f"        server {a} max_fails=0;" for a in addresses)
    # The replicas serve /invocations; the gateway's path for the endpoint maps onto it.
    location = ("location / {\n            proxy_pass http://backends;",
                f"location = {PATH} {{\n            proxy_pass http://backends/invocations;")
    values = {"@WORKERS@": str(workers), "@RUN@": workdir, "@BALANCE@": "random two least_conn;",
              "@SERVERS@": servers, "@KEEPALIVE@": "64", "@LISTEN@": f"127.0.0.1:{NGINX_PORT}"}
    for key, value in values.items():
        text = text.replace(key, value)
    assert location[0] in text, "the peers' nginx template changed"
    text = text.replace(*location)
    path = os.path.join(workdir, "nginx.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except FileNotFoundError:
            pass
    return total / TICKS


def busy_seconds():
    """CPU time the whole machine spent busy (all cpus, /proc/stat's first line)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS  # less idle and iowait


def nginx_pids(master):
    children = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True)
    return [master] + [int(p) for p in children.stdout.split()]


def run_wrk(script, url, conns, seconds, pids, replica_pids):
    before, replicas_before, busy_before = cpu_seconds(pids), cpu_seconds(replica_pids), \
        busy_seconds()
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", script, url],
                         capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pids) - before
    replicas = cpu_seconds(replica_pids) - replicas_before
    busy = busy_seconds() - busy_before
    match = re.search(r"RESULT rps=([0-9.]+) p99_us=(\d+) reqs=(\d+) errors=(\d+) non2xx=(\d+)",
                      out)
    if not match:
        raise RuntimeError("wrk printed no result: " + out)
    rps, p99, reqs, errors, non2xx = match.groups()
    per_request = 1e6 / max(int(reqs), 1)
    return {"rps": float(rps), "p99_ms": int(p99) / 1000, "errors": int(errors) + int(non2xx),
            "cpu_us": cpu * per_request, "replicas_us": replicas * per_request,
            "busy": busy / seconds / os.cpu_count()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--conns", default="16,64")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--balancer", default="p2c", help="flotilla up --balancer")
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            sys.exit(f"needs {tool} (bash scripts/setup.sh)")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    workdir = tempfile.mkdtemp(prefix="through-up-")
    up = nginx_proc = None
    try:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_models.py"),
                        workdir], check=True, stdout=subprocess.DEVNULL)
        up = cold_start.Up(workdir, warm_pool=0, extra=["--gateway-workers", str(args.workers),
                                                          "--balancer", args.balancer])
        served = {"name": "v1", "model": os.path.join(workdir, "mlflow_classifier"),
                  "concurrency": {"min": 32 * REPLICAS, "max": 32 * REPLICAS},
                  "per_replica_concurrency": {"min": 32, "max": 32}}
        up.call("POST", "/api/2.0/serving-endpoints", {"name": "iris", "served_models": [served]})
        view = up.wait("iris", lambda v: cold_start.ready(v, REPLICAS), timeout=120)
        addresses = [r["address"] for r in view["replicas"] if r["state"] == "ready"]
        replica_pids = [r["pid"] for r in view["replicas"] if r["state"] == "ready"]
        token = up.call("POST", "/api/2.0/tokens", {"id": "bench", "endpoints": ["iris"]})["token"]
        script = wrk_script(workdir, token)
        os.makedirs(os.path.join(workdir, "tmp-proxy-body"), exist_ok=True)
        nginx_proc = subprocess.Popen([nginx, "-g", "daemon off;", "-c",
                                       nginx_config(workdir, addresses, args.workers)],
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(0.5)
        targets = {"flotilla": (up.gateway + PATH, [up.process.pid]),
                   "nginx": (f"http://127.0.0.1:{NGINX_PORT}{PATH}", nginx_pids(nginx_proc.pid))}
        for name, (url, pids) in targets.items():  # warm both; a wrong path fails here
            result = run_wrk(script, url, 8, 1, pids, replica_pids)
            if result["errors"]:
                raise RuntimeError(f"{name}: {result['errors']} errors in the warm-up")
        print(f"# {REPLICAS} xgboost replicas (iris), gateway workers = nginx workers = "
              f"{args.workers}, flotilla --balancer {args.balancer}, {args.reps} pairs of {args.seconds} s per connection count, "
              f"{os.cpu_count()} cpus")
        print(f"{'conns':>5} {'rep':>3} {'target':>8} {'req/s':>9} {'p99 ms':>7} "
              f"{'CPU-us/req':>10} {'replicas':>8} {'busy':>5} {'errors':>6}")
        summary = []
        for conns in [int(c) for c in args.conns.split(",")]:
            runs = {"flotilla": [], "nginx": []}
            for rep in range(args.reps):
                order = ["flotilla", "nginx"] if rep % 2 == 0 else ["nginx", "flotilla"]
                for name in order:
                    url, pids = targets[name]
                    result = run_wrk(script, url, conns, args.seconds, pids, replica_pids)
                    runs[name].append(result)
                    print(f"{conns:>5} {rep + 1:>3} {name:>8} {result['rps']:>9.0f} "
                          f"{result['p99_ms']:>7.2f} {result['cpu_us']:>10.1f} "
                          f"{result['replicas_us']:>8.1f} {result['busy']:>5.2f} "
                          f"{result['errors']:>6}", flush=True)
            ratios = [f["rps"] / n["rps"] for f, n in zip(runs["flotilla"], runs["nginx"])]
            summary.append((conns, runs, ratios))
        print("\nconns  target    req/s (median)  p99 ms  CPU-us/req  replicas  errors  "
              "flotilla/nginx req/s per pair -> median")
        for conns, runs, ratios in summary:
            for name in ("flotilla", "nginx"):
                rs = runs[name]
                line = (f"{conns:>5}  {name:<8} {statistics.median(r['rps'] for r in rs):>14.0f}"
                        f"  {statistics.median(r['p99_ms'] for r in rs):>6.2f}"
                        f"  {statistics.median(r['cpu_us'] for r in rs):>10.1f}"
                        f"  {statistics.median(r['replicas_us'] for r in rs):>8.1f}"
                        f"  {sum(r['errors'] for r in rs):>6}")
                if name == "flotilla":
                    line += ("  " + " ".join(f"{r:.2f}" for r in ratios) +
                             f" -> {statistics.median(ratios):.2f}x")
                print(line)
    finally:
        if nginx_proc:
            os.killpg(nginx_proc.pid, 15)
            nginx_proc.wait(timeout=10)
        if up:
            up.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
