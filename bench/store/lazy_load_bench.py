#!/usr/bin/python3
"""Time to ready for a replica whose language model is a URL: lazy loading (the loader reads
each safetensors header and tensor as soon as its bytes arrive, and asks for them first) vs
download-then-load (`--no-lazy-load`), in one run (issue #6, item 4).

The model is the 50M-parameter benchmark shape of issue 7 (bf16, 108 MiB of safetensors,
random weights from tests/fixtures/make_llm.py --bench), packed with `flotilla artifact pack`
and served by nginx on 127.0.0.1 with `limit_rate` per request (a remote object store). The
replica pulls it with 8 connections into an empty cache each time. The clock runs from exec to
the first 200 from /v1/completions; the cached and local rows show the load alone.

    /usr/bin/python3 bench/store/lazy_load_bench.py [--rate-mib 16] [--runs 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pull_bench import make_dirs, start_nginx, stop_nginx  # noqa: E402
from url_cold_start import first_request_seconds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build/release/flotilla"))


def ready_seconds(argv):
    """Seconds from exec to the replica's first 200 from /v1/completions."""
    return first_request_seconds(argv, "/v1/completions",
                                 {"model": "bench", "prompt": [1, 2, 3], "max_tokens": 1})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mib", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    work, www = make_dirs()
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_llm.py"), www,
                    "--bench"], check=True, stdout=subprocess.DEVNULL)
    model_dir = os.path.join(www, "bench-50m")
    subprocess.run([FLOTILLA, "artifact", "pack", model_dir], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for root, dirs, files in os.walk(www):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    size_mib = sum(os.path.getsize(os.path.join(model_dir, f))
                   for f in os.listdir(model_dir)) / 2**20
    nginx, port = start_nginx(www, work, args.rate_mib)
    url = f"http://127.0.0.1:{port}/limited/bench-50m/flotilla-manifest.json"
    cache = os.path.join(work, "cache")
    replica = [FLOTILLA, "replica", "--port", "0", "--log-level", "warn", "--name", "bench",
               "--skip-tokenizer", "--cache-dir", cache]
    configs = [("bf16", []), ("int8", ["--quantize", "int8"])]
    rows = []
    try:
        for label, extra in configs:
            times = {"eager": [], "lazy": [], "cached": [], "local": []}
            for _ in range(args.runs):
                # Alternated, so that drift in the machine's speed hits both alike.
                for mode, flags in (("eager", ["--no-lazy-load"]), ("lazy", [])):
                    shutil.rmtree(cache, ignore_errors=True)
                    times[mode].append(ready_seconds(replica + extra + flags + ["--model", url]))
                times["cached"].append(ready_seconds(replica + extra + ["--model", url]))
                times["local"].append(ready_seconds(replica + extra + ["--model", model_dir]))
            rows.append((label, {k: statistics.median(v) for k, v in times.items()}))
        print(f"LLM of {size_mib:.0f} MiB (issue 7's benchmark shape, bf16) from nginx at "
              f"{args.rate_mib} MiB/s per request, 8 connections; exec to first 200 from "
              f"/v1/completions, median of {args.runs}")
        print(f"{'weights':8} {'download then load':>18} {'lazy':>8} {'lazy vs eager':>14} "
              f"{'cached':>8} {'local path':>11}")
        for label, t in rows:
            print(f"{label:8} {t['eager']:17.2f}s {t['lazy']:7.2f}s {t['eager'] / t['lazy']:13.2f}x "
                  f"{t['cached']:7.2f}s {t['local']:10.2f}s")
    finally:
        stop_nginx(nginx, work)


if __name__ == "__main__":
    main()
