#!/usr/bin/python3
"""Gateway-added latency at half of the gateway's maximum load (issue #3).

One run, on 127.0.0.1 only:
  1. A static nginx backend (1 worker, 4 ports; ../shared/bench/peers' backend config) on cpu0,
     `flotilla gateway --upstreams` (1 worker) on cpu1.
  2. The gateway's max rate: wrk -c64 through it.
  3. The wrk connection count (1, 2, 4, ...) whose rate through the gateway is closest to half
     of that max, then at that count, interleaved: straight to one backend port, then through
     the gateway, REPS times. (Closed loop at low concurrency: wrk measures in microseconds,
     where `hey -q` has 100 µs resolution and cannot drive half the max rate on one core.)
     HAProxy (leastconn, 1 thread, the shared peers config) on cpu1 is measured the same way
     in the same run, as the peer.
  4. Added latency = proxy p50/p99 minus direct p50/p99 (medians over reps), and the
     gateway's own view: its flotilla_gateway_added_latency_seconds histogram over the
     gateway runs (time between reading a request and handing its response to the socket,
     minus the time at the replica).

    /usr/bin/python3 bench/gateway/added_latency.py [--duration 8] [--reps 3]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEERS = os.path.join(os.path.dirname(REPO), "shared", "bench", "peers")
BIN = os.environ.get("FLOTILLA_BIN", os.path.join(REPO, "build", "release", "flotilla"))
BODY = '{"instances":[[0.1,0.2,0.3,0.4]]}'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline_s=10):
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_backend(run_dir, ports):
    with open(os.path.join(PEERS, "conf", "backend-nginx.conf.tmpl")) as f:
        conf = f.read()
    listens = "".join(f"        listen 127.0.0.1:{p};\n" for p in ports)
    conf = conf.replace("@RUN@", run_dir).replace("@LISTENS@", listens)
    path = os.path.join(run_dir, "backend.conf")
    with open(path, "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["taskset", "-c", "0", "nginx", "-p", run_dir, "-e",
                             os.path.join(run_dir, "backend.err"), "-c", path, "-g", "daemon off;"],
                            start_new_session=True)
    for p in ports:
        wait_port(p)
    return proc


def start_gateway(port, upstreams):
    proc = subprocess.Popen(["taskset", "-c", "1", BIN, "gateway", "--listen", f"127.0.0.1:{port}",
                             "--upstreams", ",".join(f"127.0.0.1:{p}" for p in upstreams),
                             "--workers", "1", "--log-level", "warn"],
                            stdout=subprocess.PIPE, start_new_session=True)
    json.loads(proc.stdout.readline())
    return proc


def start_haproxy(run_dir, port, upstreams):
    with open(os.path.join(PEERS, "conf", "haproxy.cfg.tmpl")) as f:
        conf = f.read()
    servers = "".join(f"    server s{i} 127.0.0.1:{p}\n" for i, p in enumerate(upstreams))
    for key, value in {"@RUN@": run_dir, "@THREADS@": "1", "@BALANCE@": "leastconn",
                       "@SERVERS@": servers, "@LISTEN@": f"127.0.0.1:{port}"}.items():
        conf = conf.replace(key, value)
    path = os.path.join(run_dir, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["taskset", "-c", "1", "haproxy", "-db", "-f", path],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    wait_port(port)
    return proc


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def wrk(port, connections, duration):
    """(req/s, p50 µs, p99 µs, errors) of a wrk run with the shared post.lua."""
    out = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", f"-c{connections}",
                          f"-d{duration}s", "--latency", "-s", os.path.join(PEERS, "post.lua"),
                          f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, check=True).stdout
    r = dict(kv.split("=") for kv in re.search(r"RESULT (.*)", out).group(1).split())
    return (float(r["rps"]), float(r["p50_us"]), float(r["p99_us"]),
            int(r["sockerr"]) + int(r["non2xx"]))


def histogram(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    buckets = []
    for line in text.splitlines():
        m = re.match(name + r'_bucket\{.*le="([^"]+)"\} (\d+)', line)
        if m:
            buckets.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)),
                            int(m.group(2))))
    return buckets


def quantile(before, after, q):
    """q-quantile of the observations between two scrapes of a cumulative histogram, by linear
    interpolation inside the bucket."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = counts[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    lower_le, lower_count = 0.0, 0
    for le, count in counts:
        if count >= rank:
            if le == float("inf"):
                return lower_le
            span = count - lower_count
            return lower_le + (le - lower_le) * ((rank - lower_count) / span if span else 1)
        lower_le, lower_count = le, count
    return counts[-1][0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    for tool in ("nginx", "wrk", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"missing {tool}: bash scripts/setup.sh installs it")
    run_dir = tempfile.mkdtemp(prefix="flotilla-added-latency-")
    ports = [free_port() for _ in range(4)]
    gateway_port = free_port()
    backend = start_backend(run_dir, ports)
    gateway = start_gateway(gateway_port, ports)
    haproxy_port = free_port()
    haproxy = start_haproxy(run_dir, haproxy_port, ports)
    try:
        wrk(haproxy_port, 64, 2)
        wrk(gateway_port, 64, 2)  # warm up connections
        max_rate = wrk(gateway_port, 64, args.duration)[0]
        rate = max_rate / 2
        trials = {c: wrk(gateway_port, c, 2)[0] for c in (1, 2, 4, 8, 16)}
        conns = min(trials, key=lambda c: abs(trials[c] - rate))
        print(f"gateway max rate (wrk -c64): {max_rate:.0f} req/s; half: {rate:.0f} req/s; "
              f"rates by connections {trials}; measuring at -c{conns}", flush=True)
        direct, through, peer = [], [], []
        name = "flotilla_gateway_added_latency_seconds"
        before = after = None
        for rep in range(args.reps):
            direct.append(wrk(ports[0], conns, args.duration))
            peer.append(wrk(haproxy_port, conns, args.duration))
            b = histogram(gateway_port, name)
            through.append(wrk(gateway_port, conns, args.duration))
            a = histogram(gateway_port, name)
            before = before or b
            after = a
            print(f"rep {rep + 1}: " + " | ".join(
                f"{label} {r[0]:.0f} req/s p50 {r[1]:.0f} us p99 {r[2]:.0f} us"
                for label, r in (("direct", direct[-1]), ("haproxy", peer[-1]),
                                 ("flotilla", through[-1]))), flush=True)
        med = lambda runs, i: statistics.median(r[i] for r in runs)
        errors = sum(r[3] for r in direct + through + peer)
        added = lambda runs, i: med(runs, i) - med(direct, i)
        print()
        print("| path | req/s | p50 µs | p99 µs | added p50 µs | added p99 µs |")
        print("|---|---|---|---|---|---|")
        print(f"| direct to a backend | {med(direct, 0):.0f} | {med(direct, 1):.0f} | "
              f"{med(direct, 2):.0f} | | |")
        for label, runs in (("HAProxy leastconn", peer), ("flotilla gateway", through)):
            print(f"| {label} | {med(runs, 0):.0f} | {med(runs, 1):.0f} | {med(runs, 2):.0f} | "
                  f"{added(runs, 1):.0f} | {added(runs, 2):.0f} |")
        print(f"| flotilla's own added-latency histogram | | | | "
              f"{quantile(before, after, 0.5) * 1e6:.1f} | {quantile(before, after, 0.99) * 1e6:.1f} |")
        ratio = lambda i: added(through, i) / added(peer, i) if added(peer, i) > 0 else float("nan")
        print(f"\nadded latency flotilla / HAProxy: p50 {ratio(1):.2f}x, p99 {ratio(2):.2f}x")
        print(f"\nerrors: {errors}; wrk -c{conns}; max rate {max_rate:.0f} req/s, half {rate:.0f}")
    finally:
        stop(haproxy)
        stop(gateway)
        stop(backend)
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
