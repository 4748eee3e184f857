#!/usr/bin/python3
"""Python comparison server for the replica benchmarks.

Stands in for MLflow's Python scoring server: one aiohttp process serving one XGBoost
Booster with `inplace_predict`, so the C++ replica is compared against an idiomatic,
reasonably efficient Python peer.

    /usr/bin/python3 bench/replica/python_server.py --model MODEL [--name NAME]
        [--host 127.0.0.1] [--port 0] [--nthread 1]

MODEL is a booster file (.json/.ubj/...) or an MLflow model directory (its MLmodel
`flavors.xgboost.data` file is loaded as a Booster). When ready it prints one line,
`listening PORT`, to stdout.

Routes:
  POST /invocations              MLflow scoring: `dataframe_split` or `instances`
                                 -> {"predictions": [...]}
  POST /v2/models/{name}/infer   Open Inference Protocol v2, one FP32 tensor
                                 [rows, features] (or [features]) -> output `predict`
  GET  /ping, /v2/health/ready   liveness
"""

import argparse
import asyncio
import json
import os
import re
import signal
import sys

import numpy as np
import xgboost as xgb
from aiohttp import web


def resolve_model_file(path):
    if not os.path.isdir(path):
        return path
    data = "model.xgb"
    try:
        with open(os.path.join(path, "MLmodel"), encoding="utf-8") as f:
            text = f.read()
        # flavors.xgboost.data, without needing PyYAML
        m = re.search(r"^  xgboost:\n(?:    .*\n)*?    data: (\S+)", text, re.M)
        if m:
            data = m.group(1)
    except OSError:
        pass
    return os.path.join(path, data)


class BadRequest(Exception):
    pass


class Model:
    def __init__(self, path, nthread):
        self.booster = xgb.Booster(model_file=resolve_model_file(path))
        self.booster.set_param({"nthread": nthread})
        self.n_features = self.booster.num_features()
        self.feature_names = self.booster.feature_names

    def matrix(self, rows, columns=None):
        try:
            X = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise BadRequest(f"input is not a numeric matrix: {e}")
        if X.ndim == 1:
            X = X.reshape(1, -1)
        if X.ndim != 2 or X.shape[0] == 0:
            raise BadRequest(f"expected a non-empty 2-D input, got shape {list(X.shape)}")
        if columns is not None and self.feature_names and list(columns) != self.feature_names:
            try:
                X = X[:, [list(columns).index(n) for n in self.feature_names]]
            except ValueError as e:
                raise BadRequest(f"missing column: {e}")
        if X.shape[1] != self.n_features:
            raise BadRequest(f"expected {self.n_features} features, got {X.shape[1]}")
        return X

    def predict(self, X):
        return self.booster.inplace_predict(X, validate_features=False)


def json_response(obj, status=200):
    return web.Response(body=json.dumps(obj, separators=(",", ":")).encode(),
                        status=status, content_type="application/json")


def make_app(model, name):
    async def invocations(request):
        ctype = request.content_type
        if ctype != "application/json":
            return json_response({"error_code": "BAD_REQUEST",
                                  "message": f"unsupported content type {ctype}"}, 415)
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            if "dataframe_split" in body:
                split = body["dataframe_split"]
                X = model.matrix(split["data"], split.get("columns"))
            elif "instances" in body:
                X = model.matrix(body["instances"])
            else:
                raise BadRequest("expected one of dataframe_split, instances")
            preds = model.predict(X)
        except (ValueError, KeyError, TypeError, BadRequest) as e:
            return json_response({"error_code": "BAD_REQUEST", "message": str(e)}, 400)
        return json_response({"predictions": preds.tolist()})

    async def infer(request):
        if request.match_info["name"] != name:
            return json_response({"error": f"unknown model {request.match_info['name']}"}, 404)
        try:
            body = json.loads(await request.read())
            inputs = body["inputs"]
            if len(inputs) != 1:
                raise BadRequest("expected exactly one input tensor")
            t = inputs[0]
            if t.get("datatype") != "FP32":
                raise BadRequest("datatype must be FP32")
            shape = [int(d) for d in t["shape"]]
            X = np.asarray(t["data"], dtype=np.float32)
            if X.size != int(np.prod(shape)):
                raise BadRequest("shape does not match data length")
            X = model.matrix(X.reshape(shape))
            preds = model.predict(X)
        except (ValueError, KeyError, TypeError, BadRequest) as e:
            return json_response({"error": str(e)}, 400)
        out = {"model_name": name,
               "outputs": [{"name": "predict", "datatype": "FP32",
                            "shape": list(preds.shape), "data": preds.ravel().tolist()}]}
        if "id" in body:
            out["id"] = body["id"]
        return json_response(out)

    async def ping(_request):
        return web.Response(text="\n", content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/invocations", invocations)
    app.router.add_post("/v2/models/{name}/infer", infer)
    app.router.add_get("/ping", ping)
    app.router.add_get("/v2/health/ready", ping)
    return app


async def serve(args):
    model = Model(args.model, args.nthread)
    name = args.name or os.path.splitext(os.path.basename(os.path.normpath(args.model)))[0]
    runner = web.AppRunner(make_app(model, name), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--name", default=None, help="OIP model name (default: file stem)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--nthread", type=int, default=1, help="XGBoost threads per predict")
    args = p.parse_args()
    try:
        asyncio.run(serve(args))
    except xgb.core.XGBoostError as e:
        print(f"{args.model}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
