#!/usr/bin/python3
"""Prefix caching on a workload whose prompts share their start: Flotilla's replica with and
without it, same weights, same requests, one run.

Requests as llm_bench.py's (50 prompt tokens, exactly 50 out, greedy, /v1/completions, client 0
streams for the time to first token), but every prompt starts with the same 30 token ids (an
instruction such as "Correct the grammar: ...") and ends with 20 random ones. Configurations
(int8 weights and attention, 2 threads): prefix caching with 16-token KV blocks (the default:
the shared start fills one block), with 8-token blocks (three), and without prefix caching.
Each runs --reps times in turn, so drift hits all alike; medians, the ratio to no caching, and
the hit rate the replica's own counters give (flotilla_llm_prefix_cache_hits_total over
flotilla_llm_prefix_cache_queries_total).

    /usr/bin/python3 bench/llm/prefix_cache.py [--seconds 15] [--reps 3] [--clients 1,16]
"""
import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_paths  # noqa: E402  (the host's ISA flags)
import llm_bench  # noqa: E402  (the model, the replica launcher, the load generator)

SHARED_TOKENS = 30
INT8 = ["--dtype", "bfloat16", "--quantize", "int8", "--quantize-attention"]
CONFIGS = {
    "cached-16": INT8,
    "cached-8": INT8 + ["--kv-block-tokens", "8"],
    "uncached": INT8 + ["--no-prefix-caching"],
}


def prefix_counters(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("flotilla_llm_prefix_cache_hits_total", "flotilla_llm_prefix_cache_queries_total"):
            values[name] = float(value)
    return values["flotilla_llm_prefix_cache_hits_total"], values["flotilla_llm_prefix_cache_queries_total"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    prefix = [random.Random(30).randrange(3, 32000) for _ in range(SHARED_TOKENS)]
    rows = {}  # (config, clients) -> [row per rep]
    with tempfile.TemporaryDirectory() as tmp:
        model = llm_bench.make_model(tmp)
        for rep in range(args.reps):
            for name, flags in CONFIGS.items():
                proc, port = llm_bench.start_replica(model, flags, args.threads)
                try:
                    asyncio.run(llm_bench.load(port, 1, 1, prefix=prefix))  # warm-up
                    for c in clients:
                        hits0, queries0 = prefix_counters(port)
                        row = asyncio.run(llm_bench.load(port, c, args.seconds, prefix=prefix))
                        hits1, queries1 = prefix_counters(port)
                        row["hit_rate"] = (hits1 - hits0) / max(1, queries1 - queries0)
                        rows.setdefault((name, c), []).append(row)
                        print(f"rep {rep} {name:<10} {c:>3} clients {row['req_s']:6.1f} req/s "
                              f"p99 {row['p99_ms']:5.0f} ms ttft {row['ttft_p50_ms']:4.0f} ms "
                              f"hits {100 * row['hit_rate']:4.1f}% errors {row['errors']}",
                              flush=True)
                finally:
                    proc.terminate()
                    proc.wait(30)
    model, isa = kernel_paths.host_isa()
    print(f"\nhost: {model}; ISA: {' '.join(isa)}; prompts: {SHARED_TOKENS} shared + "
          f"{llm_bench.PROMPT_TOKENS - SHARED_TOKENS} random tokens, {llm_bench.OUTPUT_TOKENS} out;"
          f" medians of {args.reps}")
    print(f"{'config':<10} {'clients':>7} {'req/s':>7} {'x uncached':>10} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'ttft ms':>7} {'hit rate':>8} {'errors':>6}")
    for c in clients:
        base = statistics.median(r["req_s"] for r in rows[("uncached", c)])
        for name in CONFIGS:
            rs = rows[(name, c)]
            med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
            print(f"{name:<10} {c:>7} {med('req_s'):>7.1f} {med('req_s') / base:>9.2f}x "
                  f"{med('p50_ms'):>7.0f} {med('p99_ms'):>7.0f} {med('ttft_p50_ms'):>7.0f} "
                  f"{100 * med('hit_rate'):>7.1f}% {sum(r['errors'] for r in rs):>6}")


if __name__ == "__main__":
    sys.exit(main())
