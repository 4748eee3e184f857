#!/usr/bin/python3
"""Gateways at fleet scale (issue #20 item 7, docs/fleet.md): tail latency against gateway count
and sample staleness, against the one-gateway ideal.

The model (the `fleet` and `fleet-1m` scenarios): 5 ms requests, lognormal (sigma 0.5), on a
fixed fleet of replicas with 8 slots each (cap = saturation point = 8; exact processor sharing
past it): 200K req/s on 160 replicas or 1M req/s on 800, 1000 or 5000 in flight on 1280 or 6400
slots (78%). Each row: the median over 3 seeds of p50 / p99 / p99.9 (ms; the histogram's 5%
buckets), their ratio to the one gateway's, requests that waited in a gateway's queue, rejected
ones (1 s queue deadline), and dispatches past a replica's cap. Rows "own": no sharing, each
gateway balances on its own counts capped at max(1, 8 / N).

Bounded: each run simulates 4M (200K for 20 s) or 5M (1M for 5 s) requests, 5 to 15 s of wall
time on one core; 39 runs a QPS, two at a time: about 3 minutes a QPS.

    /usr/bin/python3 bench/sim/fleet.py [--qps 200k|1m|both] [--jobs 2]
"""
import argparse
import json
import os
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("FLOTILLA_BIN", os.path.join(REPO, "build", "release", "flotilla"))
LEVELS = {"200k": ("fleet", 160), "1m": ("fleet-1m", 800)}
GATEWAYS = [4, 16, 64]
STALENESS_MS = [0, 100, 1000]
SEEDS = [1, 2, 3]


def run(scenario, replicas, gateways, sample_ms, own, seed):
    args = [BIN, "sim", scenario, "--policy", "static", "--static-replicas", str(replicas),
            "--gateways", str(gateways), "--gateway-sample-ms", str(sample_ms),
            "--seed", str(seed), "-o", "json"]
    if own:
        args.append("--gateway-own-view")
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def configs():
    yield 1, 0, False
    for gateways in GATEWAYS:
        for sample_ms in STALENESS_MS:
            yield gateways, sample_ms, False
    for gateways in GATEWAYS:
        yield gateways, 0, True


def table(level, jobs):
    scenario, replicas = LEVELS[level]
    keys = [(c, seed) for c in configs() for seed in SEEDS]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda k: run(scenario, replicas, *k[0], k[1]), keys))
    by_config = {}
    for (config, _), result in zip(keys, results):
        by_config.setdefault(config, []).append(result)

    def median(config, field):
        return statistics.median(r[field] for r in by_config[config])

    ideal = {f: median((1, 0, False), f) for f in ("p50_ms", "p99_ms", "p999_ms")}
    requests = median((1, 0, False), "requests")
    print(f"\n{scenario}: {requests:.0f} requests a run, {replicas} replicas of 8 slots, "
          f"median of seeds {SEEDS}\n")
    print("| gateways | sample ms | p50 ms | p99 ms | p99.9 ms | p50 / p99 / p99.9 vs 1 gateway "
          "| queued | rejected | over a cap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config in by_config:
        gateways, sample_ms, own = config
        p = [median(config, f) for f in ("p50_ms", "p99_ms", "p999_ms")]
        ratio = " / ".join(f"{v / ideal[f]:.2f}" for v, f in zip(p, ideal))
        sample = "own, cap 8/N" if own else ("exact" if sample_ms == 0 else str(sample_ms))
        if gateways == 1:
            sample = "(one gateway)"
        print(f"| {gateways} | {sample} | {p[0]:.2f} | {p[1]:.1f} | {p[2]:.1f} | {ratio} "
              f"| {median(config, 'queued'):.0f} | {median(config, 'rejected'):.0f} "
              f"| {median(config, 'over_cap'):.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qps", choices=["200k", "1m", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    for level in (["200k", "1m"] if args.qps == "both" else [args.qps]):
        table(level, args.jobs)


if __name__ == "__main__":
    main()
