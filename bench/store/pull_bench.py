#!/usr/bin/python3
"""Download of a large artifact from nginx on loopback: `flotilla pull` with N parallel ranged
connections vs `curl` (one stream), in one run (issue #6).

nginx serves the file twice: /limited/ with `limit_rate` per connection (a remote object store
gives each connection a bounded rate), and /full/ without a limit (the loopback link and the
disk are the limit). Each configuration is run --runs times; medians are printed, with the
ratio to curl on the same path. Every pull starts from an empty cache and its digest is checked.

    /usr/bin/python3 bench/store/pull_bench.py [--size-mib 1024] [--rate-mib 32] [--runs 3]
"""
import argparse
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build/release/flotilla"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(root, work, rate_mib):
    port = free_port()
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off;
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  server {{
    listen 127.0.0.1:{port};
    location /full/ {{ alias {root}/; }}
    location /limited/ {{ alias {root}/; limit_rate {rate_mib}m; }}
  }}
}}
""")
    proc = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("nginx did not start")


def stop_nginx(nginx, work):
    """Stops what start_nginx started and removes the work directory of make_dirs."""
    nginx.terminate()
    nginx.wait()
    shutil.rmtree(work, ignore_errors=True)


def make_dirs():
    """A work directory with a www/ directory in it, both readable by nginx's workers."""
    work = tempfile.mkdtemp(prefix="flotilla-store-bench-")
    www = os.path.join(work, "www")
    os.makedirs(www)
    for d in (work, www):
        os.chmod(d, 0o755)
    return work, www


def timed(argv):
    start = time.monotonic()
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return time.monotonic() - start, out.strip().splitlines()[-1] if out.strip() else ""


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rate-mib", type=int, default=32, help="nginx limit_rate per connection")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", default="1,2,4,8,16")
    args = parser.parse_args()

    work, www = make_dirs()
    artifact = os.path.join(www, "model.bin")
    with open(artifact, "wb") as f:
        for _ in range(args.size_mib):
            f.write(os.urandom(1 << 20))
    expected = sha256(artifact)
    nginx, port = start_nginx(www, work, args.rate_mib)
    size = args.size_mib << 20
    try:
        print(f"{args.size_mib} MiB from nginx on 127.0.0.1; /limited/ at {args.rate_mib} MiB/s "
              f"per connection; median of {args.runs} runs")
        print(f"{'path':8} {'client':22} {'seconds':>8} {'MiB/s':>8} {'vs curl':>8}")
        for path in ("limited", "full"):
            url = f"http://127.0.0.1:{port}/{path}/model.bin"
            curl_times = []
            for _ in range(args.runs):
                target = os.path.join(work, "curl.bin")
                seconds, _ = timed(["curl", "-sf", "-o", target, url])
                assert sha256(target) == expected, "curl: wrong bytes"
                os.remove(target)
                curl_times.append(seconds)
            curl = statistics.median(curl_times)
            print(f"{path:8} {'curl (1 stream)':22} {curl:8.2f} {size / curl / 2**20:8.1f} "
                  f"{1.0:8.2f}x", flush=True)
            for n in [int(c) for c in args.connections.split(",")]:
                times = []
                for _ in range(args.runs):
                    data_dir = os.path.join(work, "data")
                    seconds, local = timed([FLOTILLA, "pull", url, "--data-dir", data_dir,
                                            "--connections", str(n), "--log-level", "warn"])
                    assert sha256(local) == expected, "flotilla pull: wrong bytes"
                    shutil.rmtree(data_dir)
                    times.append(seconds)
                t = statistics.median(times)
                print(f"{path:8} {f'flotilla pull -c {n}':22} {t:8.2f} {size / t / 2**20:8.1f} "
                      f"{curl / t:8.2f}x", flush=True)
    finally:
        stop_nginx(nginx, work)


if __name__ == "__main__":
    main()
