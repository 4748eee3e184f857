#!/usr/bin/python3
"""Quality of the quantized weight formats, measured: how often their greedy next token is the one
bf16 weights pick, over 1,000 positions of the side-by-side benchmark model.

The model is make_tiny_llama.py's (../shared/peers/llama.cpp: random weights, hidden 512, 8
layers, vocab 32000), served by `flotilla replica` over /v1/completions. Text: 20 prompts of 50
random token ids, each continued by 50 greedy tokens of the bf16 model. Position k of a text is
its first 50 + k tokens; every format is asked for its greedy next token there (max_tokens 1),
bf16 included, so that all are measured the same way (teacher forcing: one format's error does
not carry into the next position). Agreement: the share of the 1,000 positions where a format's
token is bf16's. Formats: fp32; int8 and fp8 with per-channel scales, on the MLP and LM head only
and with the attention projections too (--quantize-attention, the per-layer-group switch).

The positions are split by bf16's margin (its top-1 minus top-2 log-probability, from
logprobs 2): random weights give flat distributions, where a small margin flips under any
rounding. llama.cpp's server, on the same weights, is asked the same positions in BF16 and Q8_0
(weights in blocks of 32 with a scale each) for the same agreement figure: how far per-channel
scales are from its per-block ones.

    /usr/bin/python3 bench/llm/quality.py [--texts 20] [--tokens 50] [--formats ...]
        [--peer-bin DIR | --no-peer]
"""
import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_paths  # noqa: E402  (the host's ISA flags)
import llm_bench  # noqa: E402  (the replica launcher)
import side_by_side  # noqa: E402  (the peer's build, weights and launcher)

PROMPT_TOKENS = 50
FORMATS = {
    "bf16": ["--dtype", "bfloat16"],
    "fp32": ["--dtype", "float32"],
    "int8-mlp": ["--dtype", "bfloat16", "--quantize", "int8"],
    "int8": ["--dtype", "bfloat16", "--quantize", "int8", "--quantize-attention"],
    "fp8-mlp": ["--dtype", "bfloat16", "--quantize", "fp8"],
    "fp8": ["--dtype", "bfloat16", "--quantize", "fp8", "--quantize-attention"],
}


def make_model(directory):
    subprocess.run(["/usr/bin/python3", os.path.join(side_by_side.PEER_DIR, "make_tiny_llama.py"),
                    "--out", directory, "--no-gguf"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(directory, "hf")


async def complete(session, port, prompt, max_tokens):
    """Flotilla's greedy tokens, and the first one's top-1 minus top-2 log-probability."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "logprobs": 2}
    async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {await response.text()}")
        logprobs = (await response.json())["choices"][0]["logprobs"]
    top = sorted(logprobs["top_logprobs"][0].values(), reverse=True)
    return [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]], top[0] - top[1]


async def complete_peer(session, port, prompt, max_tokens):
    """llama-server's greedy tokens (no margin)."""
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "top_k": 1,
            "return_tokens": True, "cache_prompt": True}
    async with session.post(f"http://127.0.0.1:{port}/completion", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {await response.text()}")
        return (await response.json())["tokens"], None


async def run_all(port, jobs, concurrency=8, ask=complete):
    """ask() for every (prompt, max_tokens) in jobs, in order, `concurrency` at a time."""
    results = [None] * len(jobs)
    queue = list(enumerate(jobs))
    async with aiohttp.ClientSession() as session:
        async def worker():
            while queue:
                i, (prompt, max_tokens) = queue.pop()
                results[i] = await ask(session, port, prompt, max_tokens)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def with_server(start, work):
    proc, port = start()
    try:
        return asyncio.run(work(port))
    finally:
        proc.terminate()
        proc.wait(30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=50, help="greedy tokens a text")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--peer-bin", help="llama.cpp's bin directory (default: build.sh's)")
    parser.add_argument("--no-peer", action="store_true", help="Flotilla's formats only")
    args = parser.parse_args()
    rng = random.Random(22)
    prompts = [[rng.randrange(3, 32000) for _ in range(PROMPT_TOKENS)] for _ in range(args.texts)]
    peer_bin = None if args.no_peer else (args.peer_bin or side_by_side.build_peer())
    picks, margins = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        if peer_bin:
            model, ggufs = side_by_side.make_models(peer_bin, tmp, ["BF16", "Q8_0"])
        else:
            model = make_model(tmp)

        def ours(name):
            return lambda: llm_bench.start_replica(model, FORMATS[name], 2)

        generated = with_server(ours("bf16"), lambda port: run_all(
            port, [(p, args.tokens) for p in prompts]))
        continuations = [tokens for tokens, _ in generated]
        # Position k of text t: the prompt and the first k greedy tokens.
        positions = [(p + c[:k], 1) for p, c in zip(prompts, continuations)
                     for k in range(args.tokens)]
        for name in args.formats.split(","):
            answers = with_server(ours(name), lambda port: run_all(port, positions))
            picks[name] = [tokens[0] for tokens, _ in answers]
            if name == "bf16":
                margins = [margin for _, margin in answers]
        if peer_bin:
            for gguf_type in ("BF16", "Q8_0"):
                answers = with_server(
                    lambda: side_by_side.start_peer(peer_bin, ggufs[gguf_type]),
                    lambda port: run_all(port, positions, ask=complete_peer))
                picks[f"llama.cpp {gguf_type}"] = [tokens[0] for tokens, _ in answers]
    own = [c[k] for c in continuations for k in range(args.tokens)]
    model_name, isa = kernel_paths.host_isa()
    print(f"host: {model_name}; ISA: {' '.join(isa)}")
    print(f"{len(positions)} positions ({args.texts} texts x {args.tokens} greedy bf16 tokens)")
    # The same reference for all: bf16's pick at each position (or its own generation).
    reference = picks.get("bf16", own)
    bands = []
    if margins:
        ordered = sorted(margins)
        cuts = [0.0] + [ordered[len(ordered) * q // 4] for q in (1, 2, 3)] + [float("inf")]
        bands = list(zip(cuts, cuts[1:]))
        print("bf16's top-1 minus top-2 log-probability, quartiles: " +
              ", ".join(f"{c:.3f}" for c in cuts[1:4]))
    header = "".join(f" {f'{lo:.3f}-{hi:.3f}':>12}" for lo, hi in bands)
    print(f"{'format':<16} {'agrees with bf16':>17}{header}")
    for name, tokens in picks.items():
        peer = name.startswith("llama.cpp")
        # llama.cpp's Q8_0 against its own BF16: the same question on its side.
        base = picks["llama.cpp BF16"] if peer and name != "llama.cpp BF16" else reference
        same = [a == b for a, b in zip(tokens, base)]
        cells = ""
        for lo, hi in bands:
            band = [s for s, m in zip(same, margins) if lo <= m < hi]
            cells += f" {100 * sum(band) / max(1, len(band)):>11.1f}%"
        against = " (vs its BF16)" if base is not reference else ""
        print(f"{name:<16} {sum(same):>7}/{len(same)} {100 * sum(same) / len(same):6.1f}%"
              f"{cells}{against}")
    # bf16 asked position by position against its own greedy run: batch shape (a prompt's
    # prefill against one decode row) may round differently; this is the floor of the method.
    if "bf16" in picks:
        same = sum(a == b for a, b in zip(picks["bf16"], own))
        print(f"(bf16 position by position against its own generation: {same}/{len(own)})")


if __name__ == "__main__":
    sys.exit(main())
