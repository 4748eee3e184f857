#!/usr/bin/python3
"""A user's own model server for the external runtime's tests (external_test.py): Python's
standard library only, nothing of Flotilla's, speaking the Open Inference Protocol v2 over
HTTP as any server of a team's own would.

    oip_server.py --port PORT --name MODEL [--fail-ready]

The model sums each row of its FP32 input "x" (shape [n, k]): output "sum" (FP32, [n]), and
"pid" (INT64, [1]), this process's id, so that a test can tell replicas apart. Health routes,
model metadata and readiness, and /metrics (a request counter in Prometheus text). Bad input
is a 400 with {"error": "..."}, an unknown model a 404, as KServe's servers answer. It logs
one line at start to stderr, which lands in the replica's log file.
"""
import argparse
import http.server
import json
import os
import sys
import threading

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--name", required=True)
parser.add_argument("--fail-ready", action="store_true", help="never answer ready")
args = parser.parse_args()

requests_total = 0
lock = threading.Lock()
METADATA = {"name": args.name, "versions": ["1"], "platform": "python-oip-test",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
            "outputs": [{"name": "sum", "datatype": "FP32", "shape": [-1]},
                        {"name": "pid", "datatype": "INT64", "shape": [1]}]}


class BadRequest(Exception):
    pass


def infer(body):
    try:
        request = json.loads(body)
    except ValueError as e:
        raise BadRequest(f"invalid JSON: {e}")
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest("expected one input named 'x'")
    x = inputs[0]
    if x.get("name") != "x":
        raise BadRequest(f"unknown input '{x.get('name')}': expected 'x'")
    if x.get("datatype") != "FP32":
        raise BadRequest(f"input 'x': datatype {x.get('datatype')}, expected FP32")
    shape, data = x.get("shape"), x.get("data")
    if (not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(d, int) for d in shape)
            or not isinstance(data, list) or len(data) != shape[0] * shape[1]):
        raise BadRequest(f"input 'x': shape {shape} does not fit {len(data or [])} values "
                         "(expected [rows, columns])")
    rows, columns = shape
    sums = [float(sum(data[r * columns:(r + 1) * columns])) for r in range(rows)]
    return {"model_name": args.name, "id": request.get("id", ""),
            "outputs": [{"name": "sum", "datatype": "FP32", "shape": [rows], "data": sums},
                        {"name": "pid", "datatype": "INT64", "shape": [1],
                         "data": [os.getpid()]}]}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, payload, content_type="application/json"):
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def model_path(self):
        prefix = f"/v2/models/{args.name}"
        path = self.path.split("?", 1)[0]
        if not path.startswith("/v2/models/"):
            return None
        if path != prefix and not path.startswith(prefix + "/"):
            return "unknown"
        return path[len(prefix):]

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/v2/health/live":
            return self.answer(200, {"live": True})
        if path in ("/v2/health/ready", "/v2/models/" + args.name + "/ready"):
            return self.answer(503 if args.fail_ready else 200, {"ready": not args.fail_ready})
        if path == "/metrics":
            with lock:
                text = ("# HELP oip_requests_total Inference requests.\n"
                        "# TYPE oip_requests_total counter\n"
                        f"oip_requests_total {requests_total}\n")
            return self.answer(200, text.encode(), "text/plain; version=0.0.4")
        rest = self.model_path()
        if rest == "":
            return self.answer(200, METADATA)
        if rest == "unknown":
            return self.answer(404, {"error": "unknown model"})
        return self.answer(404, {"error": f"no route {path}"})

    def do_POST(self):
        global requests_total
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        rest = self.model_path()
        if rest == "unknown":
            return self.answer(404, {"error": "unknown model"})
        if rest != "/infer":
            return self.answer(404, {"error": f"no route {self.path}"})
        with lock:
            requests_total += 1
        try:
            return self.answer(200, infer(body))
        except BadRequest as e:
            return self.answer(400, {"error": str(e)})

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
print(f"oip_server: serving model {args.name} on port {args.port}", file=sys.stderr, flush=True)
server.serve_forever()
