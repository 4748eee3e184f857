#!/usr/bin/python3
"""Throughput and latency of the llm runtime on issue 7's benchmark shape (hidden 512, 8 layers,
8 heads, 4 KV heads, intermediate 1408, vocab 32000, context 512: ~50M parameters, random bf16
weights from tests/fixtures/make_llm.py --bench).

Workload: requests of 50 prompt tokens (random ids) generating exactly 50 tokens
(ignore_eos) over /v1/completions, from 1, 4, 8, 16 and 32 closed-loop clients. Per
configuration: completed requests/s, output tokens/s, p50/p99 latency and p50 time to first
token. The load generator shares the machine's two cores with the server, so only client 0
streams (its requests give the time to first token); the others take whole responses, which
costs the client far less CPU than parsing 50 events per request. Configurations: fp32, bf16, int8, fp8 weights; batching off (one sequence at a time);
overlap of output work off. The replica gets --llm-threads (default 2); the load generator is
this Python process (asyncio + aiohttp) on the same machine.

Against llama.cpp's server, same weights and requests in the same run: bench/llm/side_by_side.py
(this script measures Flotilla's configurations alone).

    /usr/bin/python3 bench/llm/llm_bench.py [--seconds 20] [--clients 1,4,8,16,32]
        [--configs fp32,bf16,int8,fp8,bf16-nobatch,bf16-nooverlap] [--threads 2]
"""
import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build/release/flotilla"))
PROMPT_TOKENS = 50
OUTPUT_TOKENS = 50

CONFIGS = {
    "fp32": ["--dtype", "float32"],
    "bf16": ["--dtype", "bfloat16"],
    "int8": ["--dtype", "bfloat16", "--quantize", "int8", "--quantize-attention"],
    "fp8": ["--dtype", "bfloat16", "--quantize", "fp8", "--quantize-attention"],
    "int8-mlp": ["--dtype", "bfloat16", "--quantize", "int8"],
    "bf16-nobatch": ["--dtype", "bfloat16", "--max-sequences", "1"],
    "bf16-nooverlap": ["--dtype", "bfloat16", "--no-overlap"],
}
# Prefill budgets (issue 22, prefill with decode): prompt tokens a step, beside the decodes.
for budget in (0, 16, 32, 64, 128):
    CONFIGS[f"int8-prefill{budget}"] = CONFIGS["int8"] + ["--max-prefill-tokens-per-step",
                                                          str(budget)]



def read_bandwidth_worker(_):
    import numpy as np
    a = np.ones(50_000_000, dtype=np.float32)  # 200 MB, far past the caches
    a.sum()
    start = time.monotonic()
    for _ in range(5):
        a.sum()
    return 5 * a.nbytes / (time.monotonic() - start)


def read_bandwidth(processes):
    """Bytes/s that `processes` concurrent readers stream from memory in all (numpy sums)."""
    import multiprocessing
    with multiprocessing.Pool(processes) as pool:
        return sum(pool.map(read_bandwidth_worker, range(processes)))


def decode_bytes(config, config_name):
    """Weight bytes one decode step reads in a configuration (what bounds batch-1 decoding)."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    attention = h * (h + 2 * kv) + h * h
    mlp = 3 * h * inter
    layers = config["num_hidden_layers"]
    wide = 4 if config_name == "fp32" else 2
    narrow = 1 if config_name.startswith(("int8", "fp8")) else wide
    attention_bytes = narrow if "attention" in " ".join(CONFIGS[config_name]) else wide
    return layers * (attention * attention_bytes + mlp * narrow) + vocab * h * narrow


def inter_token_totals(port):
    """(sum, count) of the replica's inter-token latency histogram."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("flotilla_llm_inter_token_latency_seconds_"):
            name, value = line.split()
            values[name] = float(value)
    return (values["flotilla_llm_inter_token_latency_seconds_sum"],
            values["flotilla_llm_inter_token_latency_seconds_count"])


def make_model(directory):
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_llm.py"),
                    directory, "--bench"], check=True)
    return os.path.join(directory, "bench-50m")


def start_replica(model, extra, threads):
    argv = [FLOTILLA, "replica", "--model", model, "--name", "bench", "--skip-tokenizer",
            "--llm-threads", str(threads), "--workers", "1", "--log-level", "warn"] + extra
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"replica exited: {' '.join(argv)}")
    return proc, json.loads(line)["port"]


async def one_request(session, url, rng, stream, prefix=()):
    """(latency, time to first token or None, gaps between streamed tokens) of one request:
    `prefix`, then random token ids up to PROMPT_TOKENS."""
    prompt = list(prefix) + [rng.randrange(3, 32000) for _ in range(PROMPT_TOKENS - len(prefix))]
    body = {"model": "bench", "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        # A model served without a tokenizer streams no text: ids make each token an event
        # (llama-server, which streams text, ignores the field).
        body["return_token_ids"] = True
    start = time.monotonic()
    first = last = None
    gaps = []
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {await response.text()}")
        if not stream:
            usage = (await response.json())["usage"]
            assert usage["completion_tokens"] == OUTPUT_TOKENS, usage
            return time.monotonic() - start, None, []
        async for line in response.content:
            if line.startswith(b"data: {"):
                now = time.monotonic()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    return time.monotonic() - start, first - start, gaps


LOAD_CALLS = itertools.count()


async def load(port, clients, seconds, fresh_connections=False, prefix=()):
    """Closed-loop load; fresh_connections: a new connection per request (llama-server leaves
    Nagle on, which stalls a keep-alive client ~40 ms a request); prefix: token ids every prompt
    starts with. Each call draws other prompts than the calls before it, so that neither server
    finds a prompt in its prefix or prompt cache from an earlier call."""
    call = next(LOAD_CALLS)
    url = f"http://127.0.0.1:{port}/v1/completions"
    latencies, ttfts, gaps, errors = [], [], [], []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients, force_close=fresh_connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client(index):
            rng = random.Random(f"{call}-{index}")
            while time.monotonic() < deadline:
                try:
                    latency, ttft, streamed = await one_request(session, url, rng, index == 0,
                                                                prefix)
                except (aiohttp.ClientError, RuntimeError) as error:  # counted and shown, not hidden
                    errors.append(repr(error))
                    continue
                latencies.append(latency)
                if ttft is not None:
                    ttfts.append(ttft)
                    gaps.extend(streamed)
        begin = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.monotonic() - begin
    latencies.sort()
    ttfts.sort()
    gaps.sort()
    return {
        "clients": clients,
        "requests": len(latencies),
        "req_s": len(latencies) / elapsed,
        "tok_s": len(latencies) * OUTPUT_TOKENS / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
        # The streaming client's gaps between tokens: the decoders' pace.
        "itl_p50_ms": 1000 * statistics.median(gaps) if gaps else None,
        "itl_p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else None,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", default="1,4,8,16,32")
    parser.add_argument("--configs", default="fp32,bf16,int8,fp8,bf16-nobatch,bf16-nooverlap")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write every row to this file")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(tmp)
        print(f"{'config':<15} {'clients':>7} {'req/s':>7} {'tok/s':>7} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'ttft ms':>8} {'ttft p99':>8} {'itl ms':>7} {'itl p99':>7}")
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
        bandwidth = read_bandwidth(args.threads)
        roofline = []
        for name in args.configs.split(","):
            proc, port = start_replica(model, CONFIGS[name], args.threads)
            try:
                # Warm-up (pages the weights in), then one client alone: its mean inter-token
                # latency is the batch-1 decode step, which the weight bytes bound.
                asyncio.run(load(port, 1, 1))
                sum0, count0 = inter_token_totals(port)
                asyncio.run(load(port, 1, 2))
                sum1, count1 = inter_token_totals(port)
                roofline.append((name, decode_bytes(config, name), (sum1 - sum0) / (count1 - count0)))
                for c in clients:
                    row = asyncio.run(load(port, c, args.seconds))
                    row["config"] = name
                    rows.append(row)
                    print(f"{name:<15} {c:>7} {row['req_s']:>7.1f} {row['tok_s']:>7.0f} "
                          f"{row['p50_ms']:>8.0f} {row['p99_ms']:>8.0f} "
                          f"{row['ttft_p50_ms']:>8.0f} {row['ttft_p99_ms']:>8.0f} "
                          f"{row['itl_p50_ms'] or 0:>7.1f} {row['itl_p99_ms'] or 0:>7.1f}",
                          flush=True)
            finally:
                proc.terminate()
                proc.wait(30)
        print(f"\nbatch-1 decode step against memory bandwidth ({args.threads} readers: "
              f"{bandwidth / 1e9:.1f} GB/s measured by numpy sums)")
        print(f"{'config':<15} {'weight MB':>9} {'step ms':>8} {'GB/s':>6} {'% of bw':>8} "
              f"{'bound ms':>9}")
        for name, weight_bytes, step in roofline:
            print(f"{name:<15} {weight_bytes / 1e6:>9.1f} {1000 * step:>8.2f} "
                  f"{weight_bytes / step / 1e9:>6.1f} {100 * weight_bytes / step / bandwidth:>7.0f}% "
                  f"{1000 * weight_bytes / bandwidth:>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
