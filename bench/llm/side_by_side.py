#!/usr/bin/python3
"""Flotilla's llm runtime against llama.cpp's server, same weights, same requests, one run.

Builds (or reuses) llama.cpp from ../shared/peers/llama.cpp (build.sh: -march=native), writes the
same random weights for both with its make_tiny_llama.py (hidden 512, 8 layers, 8 heads, 4 KV
heads, intermediate 1408, vocab 32000: 56.4M parameters), and measures each pair one server at
a time on the same load: /v1/completions with a 50-token-id prompt, exactly 50 tokens out
(greedy, ignore_eos), from 1, 4, 16 and 32 closed-loop clients (client 0 streams: its time to
first token; the others take whole responses), a new connection per request for both servers
(llama-server leaves Nagle on: a keep-alive client stalls ~40 ms a request on it).

Pairs: llama.cpp Q8_0 vs Flotilla int8 (weights and attention projections, per-channel
scales), llama.cpp BF16 vs Flotilla bf16, and llama.cpp F16 vs Flotilla fp32 where the CPU has no
native BF16 (no avx512_bf16). llama-server: 2 threads, 16 slots, continuous batching, flash
attention, 8192 tokens of context (512 a slot); `flotilla replica`: 2 threads (--llm-threads), its
defaults otherwise (up to 64 sequences a step). Each pair runs --reps times, the servers'
order alternating (ABBA) so drift hits both alike; medians. A failed request (a connection
error or a status other than 200) is counted per side and shown, with the first error. Printed
with the host's CPU, its ISA flags, the kernel path Flotilla runs and the memory bandwidth two
readers get.

    /usr/bin/python3 bench/llm/side_by_side.py [--seconds 10] [--reps 3] [--clients 1,4,16,32]
        [--pairs int8,bf16] [--peer-bin DIR] [--json FILE]
"""
import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_paths  # noqa: E402  (the host's CPU and ISA flags)
import llm_bench  # noqa: E402  (the load generator, the replica launcher, the bandwidth probe)

ROOT = llm_bench.ROOT
PEER_DIR = os.path.join(os.path.dirname(ROOT), "shared", "peers", "llama.cpp")
THREADS = 2

# name -> (llama.cpp GGUF type, Flotilla replica flags)
PAIRS = {
    "int8": ("Q8_0", ["--dtype", "bfloat16", "--quantize", "int8", "--quantize-attention"]),
    "bf16": ("BF16", ["--dtype", "bfloat16"]),
    "fp32": ("F16", ["--dtype", "float32"]),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_peer():
    out = subprocess.run(["bash", os.path.join(PEER_DIR, "build.sh")], check=True,
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def make_models(peer_bin, directory, types):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(peer_bin.rstrip("/")), "..",
                                                     "llama.cpp", "gguf-py"))
    subprocess.run(["/usr/bin/python3", os.path.join(PEER_DIR, "make_tiny_llama.py"), "--out",
                    directory], check=True, env=env, stdout=subprocess.DEVNULL)
    f16 = os.path.join(directory, "tiny-llama-f16.gguf")
    ggufs = {"F16": f16}
    for t in types:
        if t not in ggufs:
            out = os.path.join(directory, f"tiny-llama-{t.lower()}.gguf")
            subprocess.run([os.path.join(peer_bin, "llama-quantize"), f16, out, t], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ggufs[t] = out
    return os.path.join(directory, "hf"), ggufs


def start_peer(peer_bin, gguf):
    port = free_port()
    proc = subprocess.Popen(
        [os.path.join(peer_bin, "llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port",
         str(port), "-t", str(THREADS), "-np", "16", "-c", "8192", "-cb", "-fa"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}) on {gguf}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("llama-server did not become healthy in 120 s")


def start_ours(hf, flags):
    return llm_bench.start_replica(hf, flags, THREADS)


def measure(start, clients, seconds):
    """One server's rows, one per client count, after a warm-up."""
    proc, port = start()
    try:
        asyncio.run(llm_bench.load(port, 2, 2, fresh_connections=True))  # pages the weights in
        return {c: asyncio.run(llm_bench.load(port, c, seconds, fresh_connections=True))
                for c in clients}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kernel_path():
    """The kernel path `flotilla replica` runs here (what its llm tests print)."""
    out = subprocess.run(
        [os.path.join(ROOT, "build/release/tests/llm_test"),
         "--gtest_filter=KernelsTest.EveryPathMatchesPortable*"],
        capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "the one the engine runs" in line:
            return line.split(":", 1)[1].split("(")[0].strip()
    return "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", default="1,4,16,32")
    parser.add_argument("--pairs", help="default: int8,bf16, and fp32 without native BF16")
    parser.add_argument("--peer-bin", help="llama.cpp's bin directory (default: build.sh's)")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    model, isa = kernel_paths.host_isa()
    pairs = (args.pairs.split(",") if args.pairs else
             ["int8", "bf16"] + ([] if "avx512_bf16" in isa else ["fp32"]))
    peer_bin = args.peer_bin or build_peer()
    bandwidth = llm_bench.read_bandwidth(THREADS)
    print(f"host: {model}, {os.cpu_count()} cpus, ISA: {' '.join(isa)}; "
          f"memory bandwidth {bandwidth / 1e9:.1f} GB/s ({THREADS} readers)")
    print(f"Flotilla's kernel path: {kernel_path()}; both servers {THREADS} threads; "
          f"{args.reps} reps of {args.seconds:g} s a level, medians")
    runs = {}  # (pair, side, clients) -> [rows]
    with tempfile.TemporaryDirectory() as tmp:
        hf, ggufs = make_models(peer_bin, tmp, [PAIRS[p][0] for p in pairs])
        for rep in range(args.reps):
            for pair in pairs:
                gguf_type, ours_flags = PAIRS[pair]
                sides = [("llama.cpp", lambda: start_peer(peer_bin, ggufs[gguf_type])),
                         ("flotilla", lambda: start_ours(hf, ours_flags))]
                if rep % 2 == 1:
                    sides.reverse()
                for side, start in sides:
                    for c, row in measure(start, clients, args.seconds).items():
                        runs.setdefault((pair, side, c), []).append(row)
                print(f"  rep {rep + 1}/{args.reps} {pair} done", file=sys.stderr, flush=True)

    def median(pair, side, c, key):
        return statistics.median(r[key] for r in runs[(pair, side, c)])

    def errors(pair, side, c):  # over all reps: a failed request is a finding, not noise
        return sum(r["errors"] for r in runs[(pair, side, c)])

    print(f"\n{'pair':<16} {'clients':>7} {'req/s':>15} {'ratio':>6} {'p50 ms':>13} "
          f"{'p99 ms':>13} {'ttft p50 ms':>13} {'errors':>13}")
    print(f"{'':<16} {'':>7} {'llama   ours':>15} {'':>6} {'llama  ours':>13} "
          f"{'llama  ours':>13} {'llama  ours':>13} {'llama  ours':>13}")
    for pair in pairs:
        label = f"{PAIRS[pair][0]} / {pair}"
        for c in clients:
            cells = {k: (median(pair, "llama.cpp", c, k), median(pair, "flotilla", c, k))
                     for k in ["req_s", "p50_ms", "p99_ms", "ttft_p50_ms"]}
            peer, ours = cells["req_s"]
            print(f"{label:<16} {c:>7} {peer:>7.2f} {ours:>7.2f} {ours / peer:>5.2f}x "
                  f"{cells['p50_ms'][0]:>6.0f} {cells['p50_ms'][1]:>6.0f} "
                  f"{cells['p99_ms'][0]:>6.0f} {cells['p99_ms'][1]:>6.0f} "
                  f"{cells['ttft_p50_ms'][0]:>6.0f} {cells['ttft_p50_ms'][1]:>6.0f} "
                  f"{errors(pair, 'llama.cpp', c):>6} {errors(pair, 'flotilla', c):>6}")
    for (pair, side, c), rows in sorted(runs.items()):
        for r in rows:
            if r["errors"]:
                print(f"{side} {pair} at {c} clients: {r['errors']} failed, the first: "
                      f"{r['first_error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"pair": k[0], "side": k[1], "clients": k[2], "rows": v}
                       for k, v in runs.items()], f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
