#!/usr/bin/python3
"""The Open Inference Protocol over gRPC against REST, single-row XGBoost requests (issue 24
item 3), in one run, with one load generator for both: h2load (Debian's nghttp2-client).

One `flotilla replica` serves the iris classifier (tests/fixtures/make_models.py multiclass.ubj)
with --grpc-port; one `flotilla gateway` (--grpc-listen) fronts it with an endpoint table of
that replica. For each target (the replica itself, and the gateway in front of it) and each
concurrency C of --conns, runs alternate REST, gRPC, gRPC, REST, ... (--reps pairs of
--seconds each, after one unrecorded warm-up of each):

  REST  h2load --h1, C connections, one request at a time each: POST /v2/models/iris/infer
        with the 4-feature JSON body, as curl or requests send it;
  gRPC  h2load over HTTP/2, one connection with C concurrent streams, as a gRPC channel
        carries them: POST /inference.GRPCInferenceService/ModelInfer with the protobuf
        message tritonclient[grpc] builds (raw_input_contents, FP32 [1, 4]).

Before the runs, one call of each kind is checked to give the same probabilities (the clients
venv's tritonclient, tests/integration/clients_venv.sh). h2load cannot read gRPC's status
(it is in the trailers), so every run is also checked against the replica's own counters: as
many more 200s as h2load counted successes, and no other code. Prints each run, then per target
and concurrency the median req/s, p50 and p99 (from h2load's per-request log), the server
processes' CPU-µs per request (/proc utime + stime), and the ratio gRPC / REST per pair and its
median. Nothing is pinned; the client shares the machine with the servers.

With --instructions N, instead: the replica alone under valgrind's callgrind, and the
user-space instructions per call (every thread of the replica) over N calls of each protocol at
the first C of --conns, after 1,000 unrecorded ones. Unlike CPU time on a shared VM the count
does not drift with the machine; it leaves out the kernel, so thread hand-offs do not show.

Usage: bench/grpc/grpc_vs_rest.py [--reps 3] [--seconds 5] [--conns 1,16] [--instructions N]
       (needs build/release/flotilla or FLOTILLA_BIN, and h2load: bash scripts/setup.sh;
       valgrind for --instructions)
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FLOTILLA = os.environ.get("FLOTILLA_BIN", os.path.join(ROOT, "build", "release", "flotilla"))
ROW = [5.1, 3.5, 1.4, 0.2]
REST_BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                    "data": ROW}]})
GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"
REST_PATH = "/v2/models/iris/infer"
TICKS = os.sysconf("SC_CLK_TCK")

# Run by the clients venv's python: the request message tritonclient[grpc] sends for one row,
# and one call of it through each gRPC port, printed as JSON.
CLIENT_SCRIPT = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
row = np.array([[%s]], dtype=np.float32)
request = service_pb2.ModelInferRequest(model_name="iris")
tensor = request.inputs.add()
tensor.name, tensor.datatype = "x", "FP32"
tensor.shape.extend([1, 4])
request.raw_input_contents.append(row.tobytes())
out = {"message": request.SerializeToString().hex(), "answers": []}
for port in sys.argv[1:]:
    client = grpcclient.InferenceServerClient(url="127.0.0.1:" + port)
    i = grpcclient.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(row)
    out["answers"].append(client.infer("iris", [i]).as_numpy("predict").tolist())
print(json.dumps(out))
""" % ", ".join(str(x) for x in ROW)


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def replica_codes(port):
    """The replica's answered requests by status code, all routes."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    codes = {}
    for line in text.splitlines():
        m = re.match(r'flotilla_replica_requests_total\{.*code="(\d+)".*\} (\S+)', line)
        if m:
            codes[m.group(1)] = codes.get(m.group(1), 0) + float(m.group(2))
    return codes


def start(argv):
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, start_new_session=True)
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"{argv[1]} did not start")
    return process, json.loads(line)


def h2load(kind, port, conns, seconds, data_file, log_file, requests=None):
    """For `seconds`, or `requests` calls when given."""
    amount = ["-n", str(requests)] if requests else ["-D", str(seconds)]
    common = ["h2load", "-t", "1", *amount, "-d", data_file, "--log-file", log_file]
    if kind == "rest":
        argv = common + ["--h1", "-c", str(conns), "-m", "1",
                         "-H", "content-type: application/json",
                         f"http://127.0.0.1:{port}{REST_PATH}"]
    else:
        argv = common + ["-c", "1", "-m", str(conns), "-H", "content-type: application/grpc",
                         "-H", "te: trailers", f"http://127.0.0.1:{port}{GRPC_PATH}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 600).stdout
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed",
                  out)
    if not m:
        raise RuntimeError("h2load said:\n" + out)
    succeeded, failed = int(m.group(1)), int(m.group(2))
    latencies = []
    with open(log_file) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "200":
                latencies.append(int(parts[2]))
    latencies.sort()

    def quantile(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1000.0

    return {"succeeded": succeeded, "failed": failed,
            "rps": succeeded / seconds if seconds else None,
            "p50_ms": quantile(0.50), "p99_ms": quantile(0.99)}


def load_files(workdir, client_python, servers):
    """Checks that every (REST port, gRPC port) gives the same answer both ways, and writes the
    bodies h2load sends: {"rest": the JSON file, "grpc": the framed message file}."""
    probed = subprocess.run([client_python, "-c", CLIENT_SCRIPT] +
                            [str(grpc_port) for _, grpc_port in servers],
                            capture_output=True, text=True)
    if probed.returncode != 0:
        raise RuntimeError("the tritonclient probe failed:\n" + probed.stderr)
    probe = json.loads(probed.stdout)
    for port, _ in servers:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{REST_PATH}",
                                         REST_BODY.encode(), {"Content-Type": "application/json"})
        rest = json.loads(urllib.request.urlopen(request, timeout=30).read())
        predict = next(o for o in rest["outputs"] if o["name"] == "predict")["data"]
        for answer in probe["answers"]:
            flat = [p for row in answer for p in row]
            assert all(abs(a - b) < 1e-6 for a, b in zip(flat, predict, strict=True)), \
                (flat, predict)
    message = bytes.fromhex(probe["message"])
    data = {"rest": os.path.join(workdir, "body.json"),
            "grpc": os.path.join(workdir, "message.bin")}
    with open(data["rest"], "w") as f:
        f.write(REST_BODY)
    with open(data["grpc"], "wb") as f:
        f.write(b"\x00" + struct.pack(">I", len(message)) + message)  # gRPC framing
    return data


def count_instructions(args, workdir, client_python, model, conns):
    """Prints the replica's instructions per call of each protocol under callgrind."""
    if not shutil.which("valgrind"):
        sys.exit("valgrind not found: bash scripts/setup.sh installs it")
    out = os.path.join(workdir, "callgrind")
    replica, listening = start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
                                FLOTILLA, "replica", "--model", model, "--name", "iris",
                                "--port", "0", "--grpc-port", "0", "--log-level", "warn"])
    try:
        data = load_files(workdir, client_python, [(listening["port"], listening["grpc_port"])])
        log_file = os.path.join(workdir, "h2load.log")
        print(f"# the replica under callgrind, C={conns}, {args.instructions} calls each")
        for kind in ("rest", "grpc"):
            port = listening[{"rest": "port", "grpc": "grpc_port"}[kind]]
            h2load(kind, port, conns, 0, data[kind], log_file, requests=1000)
            subprocess.run(["callgrind_control", "-z", str(replica.pid)], check=True,
                           capture_output=True)
            run = h2load(kind, port, conns, 0, data[kind], log_file, requests=args.instructions)
            subprocess.run(["callgrind_control", "-d", str(replica.pid)], check=True,
                           capture_output=True)
            # The newest dump (callgrind.PID.N, N counting up) holds exactly the counted calls.
            dump = max((f for f in os.listdir(workdir) if f.startswith("callgrind.")),
                       key=lambda f: int(f.rsplit(".", 1)[1]) if f.count(".") == 2 else 0)
            with open(os.path.join(workdir, dump)) as f:
                total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
            if run["failed"] or run["succeeded"] != args.instructions:
                raise RuntimeError(f"{kind}: h2load {run}")
            print(f"{kind:5} {total / run['succeeded']:9.0f} instructions a call", flush=True)
    finally:
        replica.terminate()
        replica.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--conns", default="1,16")
    parser.add_argument("--instructions", type=int, default=0)
    args = parser.parse_args()
    conns = [int(c) for c in args.conns.split(",")]
    if not shutil.which("h2load"):
        sys.exit("h2load not found: bash scripts/setup.sh installs nghttp2-client")
    client_python = subprocess.run(
        ["bash", os.path.join(ROOT, "tests", "integration", "clients_venv.sh"),
         os.path.join(os.path.dirname(FLOTILLA), "clients-venv")],
        capture_output=True, text=True, check=True).stdout.strip()

    workdir = tempfile.mkdtemp(prefix="flotilla-grpc-bench-")
    processes = []
    try:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_models.py"),
                        workdir], check=True, stdout=subprocess.DEVNULL)
        model = os.path.join(workdir, "multiclass.ubj")
        if args.instructions:
            count_instructions(args, workdir, client_python, model, conns[0])
            return
        replica, listening = start([FLOTILLA, "replica", "--model", model, "--name", "iris",
                                    "--port", "0", "--grpc-port", "0", "--log-level", "warn"])
        processes.append(replica)
        table = os.path.join(workdir, "table.yaml")
        with open(table, "w") as f:
            f.write("endpoints:\n  - name: iris\n    versions:\n      - name: v1\n"
                    "        traffic: 100\n        replicas:\n"
                    f"          - {{id: r1, address: \"127.0.0.1:{listening['port']}\"}}\n")
        gateway, gateway_listening = start([FLOTILLA, "gateway", "--config", table, "--listen",
                                            "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
                                            "--log-level", "warn"])
        processes.append(gateway)
        targets = {
            "replica": {"rest": listening["port"], "grpc": listening["grpc_port"],
                        "pids": [replica.pid]},
            "gateway": {"rest": gateway_listening["port"], "grpc": gateway_listening["grpc_port"],
                        "pids": [gateway.pid, replica.pid]},
        }

        data = load_files(workdir, client_python, [(listening["port"], listening["grpc_port"]),
                                                   (gateway_listening["port"],
                                                    gateway_listening["grpc_port"])])
        log_file = os.path.join(workdir, "h2load.log")

        print(f"# iris (xgboost, 4 features, 1 row), h2load -t1, {args.seconds} s a run, "
              f"{args.reps} pairs; REST: C HTTP/1.1 connections, gRPC: 1 connection x C streams")
        results = {}
        for target, ports in targets.items():
            for c in conns:
                for kind in ("rest", "grpc"):  # warm-up, unrecorded
                    h2load(kind, ports[kind], c, 2, data[kind], log_file)
                order = []
                for rep in range(args.reps):
                    order += ["rest", "grpc"] if rep % 2 == 0 else ["grpc", "rest"]
                for kind in order:
                    before_codes = replica_codes(listening["port"])
                    before_cpu = sum(cpu_ticks(pid) for pid in ports["pids"])
                    run = h2load(kind, ports[kind], c, args.seconds, data[kind], log_file)
                    cpu = sum(cpu_ticks(pid) for pid in ports["pids"]) - before_cpu
                    after_codes = replica_codes(listening["port"])
                    gained = {k: after_codes.get(k, 0) - before_codes.get(k, 0)
                              for k in after_codes}
                    others = {k: v for k, v in gained.items() if k != "200" and v}
                    if run["failed"] or others or gained.get("200", 0) < run["succeeded"]:
                        raise RuntimeError(f"{target} {kind} c={c}: h2load {run}, replica "
                                           f"codes gained {gained}")
                    run["cpu_us"] = cpu / TICKS * 1e6 / max(1, run["succeeded"])
                    results.setdefault((target, c, kind), []).append(run)
                    print(f"{target:8} c={c:<3} {kind:5} {run['rps']:9.0f} req/s  "
                          f"p50 {run['p50_ms']:.3f} ms  p99 {run['p99_ms']:.3f} ms  "
                          f"server CPU {run['cpu_us']:.1f} us/req", flush=True)

        print("\n| target | C | REST req/s | gRPC req/s | gRPC/REST (median of pairs) | "
              "REST p50 / p99 ms | gRPC p50 / p99 ms | server CPU us/req REST / gRPC |")
        print("|---|---|---|---|---|---|---|---|")
        for target in targets:
            for c in conns:
                rest, grpc = results[(target, c, "rest")], results[(target, c, "grpc")]
                ratios = [g["rps"] / r["rps"] for r, g in zip(rest, grpc)]

                def med(runs, key):
                    return statistics.median(r[key] for r in runs)

                print(f"| {target} | {c} | {med(rest, 'rps'):.0f} | {med(grpc, 'rps'):.0f} | "
                      f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
                      f"{med(rest, 'p50_ms'):.3f} / {med(rest, 'p99_ms'):.3f} | "
                      f"{med(grpc, 'p50_ms'):.3f} / {med(grpc, 'p99_ms'):.3f} | "
                      f"{med(rest, 'cpu_us'):.1f} / {med(grpc, 'cpu_us'):.1f} |")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
