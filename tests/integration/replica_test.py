#!/usr/bin/python3
"""Black-box integration tests for `flotilla replica` (contract: docs/replica.md).

Starts the real server binary as a subprocess on 127.0.0.1 (`--port 0`), reads the
`{"event":"listening",...}` line from its stdout and talks to it over real sockets.
Models are trained in-process by tests/fixtures/make_models.py into a fresh temp dir;
expectations come from the Python XGBoost package (Debian's python3-xgboost).

Run from the repository root, with Debian's interpreter:

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v tests/integration/replica_test.py

No test waits with a bare sleep for a condition: everything polls with a deadline.
"""

import concurrent.futures
import http.client
import importlib.util
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (tests/integration/harness.py: the generic helpers)
from harness import (FLOTILLA_BIN, HTTP_TIMEOUT_S, PROMTOOL, STARTUP_DEADLINE_S,  # noqa: E402
                     RawConn, parse_metrics, raw_request, req, run_to_exit, wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MAKE_MODELS = os.path.join(REPO, "tests", "fixtures", "make_models.py")
RTOL = 1e-6
ATOL = 1e-7

IRIS_FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]

MODELS_DIR = None           # set in setUpModule
_tmp_root = None


# --------------------------------------------------------------------------- fixtures

def _load_make_models():
    spec = importlib.util.spec_from_file_location("make_models", MAKE_MODELS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def setUpModule():
    global MODELS_DIR, _tmp_root
    harness.require_binary("replica_test.py")
    _tmp_root = tempfile.mkdtemp(prefix="flotilla-replica-test-")
    MODELS_DIR = os.path.join(_tmp_root, "models")
    _load_make_models().make_all(MODELS_DIR)


def tearDownModule():
    if _tmp_root:
        shutil.rmtree(_tmp_root, ignore_errors=True)


def model_path(rel):
    return os.path.join(MODELS_DIR, rel)


class Dataset:
    """A dataset, a fixed sample of its rows, and the float32 view the server sees."""

    def __init__(self, loader, n_sample=20, seed=0):
        self.X = np.asarray(loader().data, dtype=np.float64)
        self.X32 = self.X.astype(np.float32)
        rng = np.random.RandomState(seed)
        self.idx = np.sort(rng.choice(len(self.X), n_sample, replace=False))
        self.rows = self.X32[self.idx]          # float32 sample
        self.rows64 = self.X[self.idx]          # float64 sample
        self.n_features = self.X.shape[1]


_datasets = {}


def dataset(name):
    if name not in _datasets:
        loader = {"breast_cancer": load_breast_cancer, "iris": load_iris,
                  "diabetes": load_diabetes}[name]
        _datasets[name] = Dataset(loader)
    return _datasets[name]


_boosters = {}


def booster(rel):
    if rel not in _boosters:
        b = xgb.Booster(model_file=model_path(rel))
        b.set_param({"nthread": 1})
        _boosters[rel] = b
    return _boosters[rel]


def booster_predict(rel, X32):
    b = booster(rel)
    return b.predict(xgb.DMatrix(np.asarray(X32, dtype=np.float32),
                                 feature_names=b.feature_names, missing=np.nan))


_classifiers = {}


def classifier(rel):
    if rel not in _classifiers:
        c = xgb.XGBClassifier()
        c.load_model(model_path(rel))
        c.get_booster().set_param({"nthread": 1})
        _classifiers[rel] = c
    return _classifiers[rel]


# --------------------------------------------------------------------------- server

class Server(harness.Server):
    """One `flotilla replica` subprocess (harness.Server runs it and reads the listening
    line; `name` is the model name from that line)."""

    def __init__(self, model, *args, deadline_s=STARTUP_DEADLINE_S):
        super().__init__([FLOTILLA_BIN, "replica", "--model", model, "--host", "127.0.0.1",
                          "--port", "0", *args], deadline_s=deadline_s)


def start_server(owner, model, *args, cls_level=False):
    """Start a server and register its stop as a (class) cleanup of `owner`."""
    srv = Server(model, *args)
    if cls_level:
        owner.addClassCleanup(srv.stop)
    else:
        owner.addCleanup(srv.stop)
    return srv


# --------------------------------------------------------------------------- bodies

def _jsonable(a):
    """numpy array -> nested lists; NaN -> None (JSON null = missing value)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        obj = a.astype(object)
        obj[np.isnan(a)] = None
        return obj.tolist()
    return a.tolist()


def oip_tensor(X, datatype="FP32", nested=False, name="input-0", shape=None):
    X = np.asarray(X)
    if datatype == "FP32":
        X = X.astype(np.float32)
    data = _jsonable(X) if nested else _jsonable(X.reshape(-1))
    return {"name": name, "shape": list(shape if shape is not None else X.shape),
            "datatype": datatype, "data": data}


def oip_body(X, **kw):
    return {"inputs": [oip_tensor(X, **kw)]}


def oip_columnar_body(X, names, order=None, col_shape="1d"):
    X = np.asarray(X, dtype=np.float32)
    order = order if order is not None else range(len(names))
    inputs = []
    for j in order:
        col = X[:, j]
        shape = [len(col)] if col_shape == "1d" else [len(col), 1]
        inputs.append({"name": names[j], "shape": shape, "datatype": "FP32",
                       "data": _jsonable(col)})
    return {"inputs": inputs}


def positional_names(n):
    return [f"c{i}" for i in range(n)]


def csv_body(X, names):
    lines = [",".join(names)]
    for row in np.asarray(X, dtype=np.float32):
        lines.append(",".join(repr(float(v)) for v in row))
    return ("\n".join(lines) + "\n").encode()


def flatten(x):
    if isinstance(x, list):
        out = []
        for e in x:
            out.extend(flatten(e))
        return out
    return [x]


def output_by_name(resp_json, name):
    outs = {o["name"]: o for o in resp_json["outputs"]}
    if name not in outs:
        raise AssertionError(f"output {name!r} missing: {list(outs)}")
    return outs[name]


# --------------------------------------------------------------------------- base case

class ReplicaTestCase(unittest.TestCase):
    maxDiff = 4000

    # -- assertions
    def assertRefused(self, flag, value):
        """A replica started with `flag value` exits non-zero at once, naming the flag, and
        prints nothing on stdout."""
        proc = subprocess.run([FLOTILLA_BIN, "replica", "--model", model_path("binary.json"),
                               "--port", "0", flag, value],
                              capture_output=True, text=True, timeout=STARTUP_DEADLINE_S)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(flag, proc.stderr)
        self.assertEqual(proc.stdout, "")

    def assertClose(self, got, expected, what=""):
        exp = np.asarray(expected, dtype=np.float64)
        g = np.asarray(got, dtype=np.float64)
        self.assertEqual(g.shape, exp.shape, f"{what}: shape {g.shape} != {exp.shape}")
        bad = ~np.isclose(g, exp, rtol=RTOL, atol=ATOL)
        if bad.any():
            i = np.argwhere(bad)[:5].tolist()
            self.fail(f"{what}: {int(bad.sum())} values differ; first at {i}: "
                      f"got {g[bad][:5].tolist()} expected {exp[bad][:5].tolist()}")

    def assertOipTensor(self, out, shape, datatype, expected):
        self.assertEqual(out.get("datatype"), datatype, out)
        self.assertEqual(list(out.get("shape", [])), list(shape), out)
        data = flatten(out["data"])
        self.assertEqual(len(data), int(np.prod(shape)), out)
        if datatype in ("INT64", "INT32"):
            self.assertTrue(all(isinstance(v, int) and not isinstance(v, bool) for v in data),
                            f"non-integer element in {datatype} output: {data[:10]}")
            self.assertEqual(data, [int(v) for v in np.asarray(expected).reshape(-1)])
        else:
            self.assertClose(np.asarray(data, dtype=np.float64).reshape(shape), expected,
                             f"output {out.get('name')}")

    def assertOipError(self, r, status):
        harness.assert_json_error(self, r, status)

    def assertMlflowError(self, r, status=400, code="BAD_REQUEST"):
        self.assertEqual(r.status, status, r)
        self.assertIn("application/json", r.headers.get("content-type", ""), r)
        j = r.json()
        self.assertIsInstance(j, dict, r)
        self.assertEqual(j.get("error_code"), code, r)
        self.assertIsInstance(j.get("message"), str, r)
        self.assertTrue(j["message"], r)

    def assertJsonOk(self, r):
        self.assertEqual(r.status, 200, r)
        self.assertIn("application/json", r.headers.get("content-type", ""), r)
        return r.json()


# --------------------------------------------------------------------------- parity

class _ParityMixin:
    """Per-model parity tests. Subclasses set MODEL (fixture path), NAME, DATA,
    FEATURES (names the server should match, or None), KIND ('booster'/'classifier')."""

    MODEL = NAME = DATA = None
    FEATURES = None
    KIND = "booster"
    CLASSES = 3

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.srv = start_server(cls, model_path(cls.MODEL), cls_level=True)
        cls.ds = dataset(cls.DATA)

    def setUp(self):
        self.assertTrue(self.srv.alive(), f"server died:\n{self.srv.stderr()}")

    def tearDown(self):
        if not self.srv.alive():
            self.fail(f"server died during the test (rc={self.srv.proc.returncode}):\n"
                      f"{self.srv.stderr()}")

    # -- expectations
    def expected_predict(self, X32):
        if self.KIND == "classifier":
            return classifier(self.MODEL + "/model.xgb").predict(np.asarray(X32, np.float32))
        rel = self.MODEL + ("/model.xgb" if self.MODEL.startswith("mlflow_") else "")
        return booster_predict(rel, X32)

    def expected_proba(self, X32):
        return classifier(self.MODEL + "/model.xgb").predict_proba(np.asarray(X32, np.float32))

    def infer_path(self):
        return f"/v2/models/{self.NAME}/infer"

    def oip(self, body, path=None):
        return req(self.srv.port, "POST", path or self.infer_path(), body)

    def check_oip_predict(self, r, X32, request_id=None):
        j = self.assertJsonOk(r)
        self.assertEqual(j.get("model_name"), self.NAME, j)
        if request_id is not None:
            self.assertEqual(j.get("id"), request_id, j)
        rows = len(X32)
        exp = self.expected_predict(X32)
        if self.KIND == "classifier":
            self.assertEqual(sorted(o["name"] for o in j["outputs"]),
                             ["predict", "predict_proba"], j)
            self.assertOipTensor(output_by_name(j, "predict"), [rows], "INT64", exp)
            proba = self.expected_proba(X32)
            self.assertEqual(proba.shape, (rows, self.CLASSES))
            self.assertOipTensor(output_by_name(j, "predict_proba"), list(proba.shape),
                                 "FP32", proba)
        else:
            self.assertEqual([o["name"] for o in j["outputs"]], ["predict"], j)
            self.assertOipTensor(output_by_name(j, "predict"), list(exp.shape), "FP32", exp)
        return j

    def mlflow(self, body, content_type="application/json"):
        return req(self.srv.port, "POST", "/invocations", body,
                    headers={"Content-Type": content_type})

    def check_mlflow(self, r, X32):
        j = self.assertJsonOk(r)
        self.assertEqual(list(j.keys()), ["predictions"], j)
        exp = self.expected_predict(X32)
        if self.KIND == "classifier":
            preds = j["predictions"]
            self.assertTrue(all(isinstance(v, int) and not isinstance(v, bool) for v in preds),
                            f"labels should be integers: {preds}")
            self.assertEqual(preds, [int(v) for v in exp])
        else:
            self.assertClose(j["predictions"], exp, "predictions")

    def names(self):
        return self.FEATURES or positional_names(self.ds.n_features)

    # -- startup / metadata
    def test_listening_line(self):
        info = self.srv.info
        self.assertEqual(info.get("event"), "listening", info)
        self.assertEqual(info.get("host"), "127.0.0.1", info)
        self.assertIsInstance(info.get("port"), int, info)
        self.assertGreater(info["port"], 0)
        self.assertEqual(info.get("model"), self.NAME, info)

    def test_model_metadata(self):
        j = self.assertJsonOk(req(self.srv.port, "GET", f"/v2/models/{self.NAME}"))
        self.assertEqual(j.get("name"), self.NAME, j)
        self.assertIsInstance(j.get("platform"), str, j)
        if "versions" in j:
            self.assertIsInstance(j["versions"], list, j)
            self.assertTrue(all(isinstance(v, str) for v in j["versions"]), j)
        ins, outs = j.get("inputs"), j.get("outputs")
        self.assertIsInstance(ins, list, j)
        self.assertIsInstance(outs, list, j)
        for t in ins + outs:
            self.assertEqual(sorted(t.keys()), ["datatype", "name", "shape"], t)
        if self.FEATURES:
            self.assertEqual([t["name"] for t in ins], self.FEATURES, j)
            for t in ins:
                # FP32 from booster feature names; an MLflow signature's "double" may
                # reasonably advertise FP64
                self.assertIn(t["datatype"], ("FP32", "FP64"), t)
                self.assertEqual(t["shape"][0], -1, t)
                self.assertIn(t["shape"], ([-1], [-1, 1]), t)
        else:
            self.assertEqual(len(ins), 1, j)
            self.assertEqual(ins[0]["shape"], [-1, self.ds.n_features], j)
            self.assertEqual(ins[0]["datatype"], "FP32", j)
        outmap = {t["name"]: t for t in outs}
        exp = self.expected_predict(self.ds.rows[:2])
        if self.KIND == "classifier":
            self.assertEqual(sorted(outmap), ["predict", "predict_proba"], j)
            self.assertEqual(outmap["predict"]["datatype"], "INT64", j)
            self.assertEqual(outmap["predict"]["shape"], [-1], j)
            self.assertEqual(outmap["predict_proba"]["datatype"], "FP32", j)
            self.assertEqual(outmap["predict_proba"]["shape"], [-1, self.CLASSES], j)
        else:
            self.assertEqual(sorted(outmap), ["predict"], j)
            self.assertEqual(outmap["predict"]["datatype"], "FP32", j)
            self.assertEqual(outmap["predict"]["shape"], [-1] + list(exp.shape[1:]), j)

    def test_model_ready(self):
        j = self.assertJsonOk(req(self.srv.port, "GET", f"/v2/models/{self.NAME}/ready"))
        self.assertEqual(j, {"name": self.NAME, "ready": True})

    def test_versioned_routes(self):
        meta = self.assertJsonOk(req(self.srv.port, "GET", f"/v2/models/{self.NAME}"))
        versions = meta.get("versions") or ["1"]
        v = versions[0]
        base = f"/v2/models/{self.NAME}/versions/{v}"
        self.assertEqual(self.assertJsonOk(req(self.srv.port, "GET", base)).get("name"),
                         self.NAME)
        self.assertEqual(self.assertJsonOk(req(self.srv.port, "GET", base + "/ready")),
                         {"name": self.NAME, "ready": True})
        X = self.ds.rows[:3]
        self.check_oip_predict(self.oip(oip_body(X), path=base + "/infer"), X)

    # -- OIP parity
    def test_oip_fp32_batch_flat(self):
        X = self.ds.rows
        self.check_oip_predict(self.oip(oip_body(X)), X)

    def test_oip_fp32_batch_nested(self):
        X = self.ds.rows
        self.check_oip_predict(self.oip(oip_body(X, nested=True)), X)

    def test_oip_fp64_batch(self):
        X64 = self.ds.rows64
        body = oip_body(X64, datatype="FP64", nested=True)
        self.check_oip_predict(self.oip(body), X64.astype(np.float32))
        body = oip_body(X64, datatype="FP64")
        self.check_oip_predict(self.oip(body), X64.astype(np.float32))

    def test_oip_whole_dataset_one_request(self):
        # more rows than --max-batch-size (64): one request is never split wrongly
        X = self.ds.X32
        self.check_oip_predict(self.oip(oip_body(X)), X)

    def test_mlflow_whole_dataset_one_request(self):
        X = self.ds.X32
        self.check_mlflow(self.mlflow({"inputs": _jsonable(X)}), X)

    def test_oip_single_row_1d_shape(self):
        for i in (0, 7, 19):
            X = self.ds.rows[i:i + 1]
            body = oip_body(X[0])          # shape [features]
            self.assertEqual(body["inputs"][0]["shape"], [self.ds.n_features])
            self.check_oip_predict(self.oip(body), X)

    def test_oip_single_row_2d_shape(self):
        X = self.ds.rows[3:4]
        self.check_oip_predict(self.oip(oip_body(X)), X)
        self.check_oip_predict(self.oip(oip_body(X, nested=True)), X)

    def test_oip_null_is_missing_value(self):
        X = self.ds.rows.copy()
        X[0, 0] = np.nan
        X[1, :] = np.nan
        X[2, 1::2] = np.nan
        self.check_oip_predict(self.oip(oip_body(X, nested=True)), X)
        self.check_oip_predict(self.oip(oip_body(X)), X)

    def test_oip_request_id_and_parameters(self):
        X = self.ds.rows[:2]
        body = oip_body(X)
        body["id"] = "req-42-üñí"
        body["parameters"] = {"foo": "bar", "n": 3, "flag": True}
        body["inputs"][0]["parameters"] = {"content_type": "np"}
        self.check_oip_predict(self.oip(body), X, request_id="req-42-üñí")

    def test_oip_output_selection(self):
        X = self.ds.rows[:5]
        body = oip_body(X)
        body["outputs"] = [{"name": "predict"}]
        j = self.assertJsonOk(self.oip(body))
        self.assertEqual([o["name"] for o in j["outputs"]], ["predict"], j)
        exp = self.expected_predict(X)
        dt = "INT64" if self.KIND == "classifier" else "FP32"
        self.assertOipTensor(j["outputs"][0], list(exp.shape), dt, exp)

    def test_oip_unknown_output_is_400(self):
        body = oip_body(self.ds.rows[:2])
        body["outputs"] = [{"name": "no_such_output"}]
        self.assertOipError(self.oip(body), 400)
        self.check_oip_predict(self.oip(oip_body(self.ds.rows[:2])), self.ds.rows[:2])

    # -- MLflow parity
    def test_mlflow_dataframe_split(self):
        X = self.ds.rows
        body = {"dataframe_split": {"columns": self.names(), "data": _jsonable(X)}}
        self.check_mlflow(self.mlflow(body), X)

    def test_mlflow_dataframe_split_with_index(self):
        X = self.ds.rows[:4]
        body = {"dataframe_split": {"index": [10, 11, 12, 13], "columns": self.names(),
                                    "data": _jsonable(X)}}
        self.check_mlflow(self.mlflow(body), X)

    def test_mlflow_instances(self):
        X = self.ds.rows
        self.check_mlflow(self.mlflow({"instances": _jsonable(X)}), X)

    def test_mlflow_inputs(self):
        X = self.ds.rows
        self.check_mlflow(self.mlflow({"inputs": _jsonable(X)}), X)

    def test_mlflow_inputs_with_params(self):
        X = self.ds.rows[:3]
        self.check_mlflow(self.mlflow({"inputs": _jsonable(X), "params": {}}), X)

    def test_mlflow_csv(self):
        X = self.ds.rows
        self.check_mlflow(self.mlflow(csv_body(X, self.names()), "text/csv"), X)

    def test_mlflow_single_row(self):
        X = self.ds.rows[5:6]
        self.check_mlflow(self.mlflow({"instances": _jsonable(X)}), X)
        body = {"dataframe_split": {"columns": self.names(), "data": _jsonable(X)}}
        self.check_mlflow(self.mlflow(body), X)
        self.check_mlflow(self.mlflow(csv_body(X, self.names()), "text/csv"), X)

    def test_mlflow_charset_utf8_ok(self):
        X = self.ds.rows[:2]
        self.check_mlflow(self.mlflow({"instances": _jsonable(X)},
                                      "application/json; charset=utf-8"), X)

    def test_mlflow_missing_value_null(self):
        X = self.ds.rows[:4].copy()
        X[0, 0] = np.nan
        X[3, :] = np.nan
        body = {"dataframe_split": {"columns": self.names(), "data": _jsonable(X)}}
        self.check_mlflow(self.mlflow(body), X)


class _NamedParityMixin(_ParityMixin):
    """Extra tests for models with feature names (booster names or MLflow signature)."""

    def test_oip_columnar_per_feature(self):
        X = self.ds.rows
        self.check_oip_predict(self.oip(oip_columnar_body(X, self.FEATURES)), X)

    def test_oip_columnar_per_feature_shuffled_and_2d(self):
        X = self.ds.rows
        body = oip_columnar_body(X, self.FEATURES, order=[2, 0, 3, 1], col_shape="2d")
        self.check_oip_predict(self.oip(body), X)

    def test_oip_columnar_single_row(self):
        X = self.ds.rows[4:5]
        self.check_oip_predict(self.oip(oip_columnar_body(X, self.FEATURES)), X)

    def test_oip_columnar_missing_feature_is_400(self):
        body = oip_columnar_body(self.ds.rows, self.FEATURES)
        del body["inputs"][1]
        self.assertOipError(self.oip(body), 400)

    def test_oip_columnar_row_count_mismatch_is_400(self):
        body = oip_columnar_body(self.ds.rows, self.FEATURES)
        body["inputs"][2]["data"] = body["inputs"][2]["data"][:-1]
        body["inputs"][2]["shape"] = [len(self.ds.rows) - 1]
        self.assertOipError(self.oip(body), 400)

    def test_mlflow_dataframe_records(self):
        X = self.ds.rows
        recs = [dict(zip(self.FEATURES, row)) for row in _jsonable(X)]
        self.check_mlflow(self.mlflow({"dataframe_records": recs}), X)

    def test_mlflow_dataframe_records_key_order_ignored(self):
        X = self.ds.rows[:6]
        recs = [{k: r[k] for k in reversed(self.FEATURES)}
                for r in (dict(zip(self.FEATURES, row)) for row in _jsonable(X))]
        self.check_mlflow(self.mlflow({"dataframe_records": recs}), X)

    def test_mlflow_dataframe_split_reordered_and_extra_columns(self):
        X = self.ds.rows
        cols = ["extra"] + list(reversed(self.FEATURES))
        data = [[123.0] + list(reversed(row)) for row in _jsonable(X)]
        body = {"dataframe_split": {"columns": cols, "data": data}}
        self.check_mlflow(self.mlflow(body), X)

    def test_mlflow_dataframe_split_missing_column_is_400(self):
        X = self.ds.rows[:3]
        body = {"dataframe_split": {"columns": self.FEATURES[:3],
                                    "data": [row[:3] for row in _jsonable(X)]}}
        self.assertMlflowError(self.mlflow(body))
        self.check_mlflow(self.mlflow({"instances": _jsonable(X)}), X)

    def test_mlflow_dataframe_records_missing_column_is_400(self):
        X = self.ds.rows[:3]
        recs = [dict(zip(self.FEATURES, row)) for row in _jsonable(X)]
        for r in recs:
            del r[self.FEATURES[2]]
        self.assertMlflowError(self.mlflow({"dataframe_records": recs}))

    def test_mlflow_dataframe_records_missing_key_is_missing_value(self):
        # pandas.DataFrame(records), as MLflow builds it, fills a key absent from some
        # records with NaN: a missing value, not an error.
        X = self.ds.rows[:3].copy()
        recs = [dict(zip(self.FEATURES, row)) for row in _jsonable(X)]
        del recs[1][self.FEATURES[2]]
        X[1, 2] = np.nan
        self.check_mlflow(self.mlflow({"dataframe_records": recs}), X)

    def test_oip_columnar_as_advertised_by_metadata(self):
        meta = self.assertJsonOk(req(self.srv.port, "GET", f"/v2/models/{self.NAME}"))
        X = self.ds.rows
        inputs = []
        for t in meta["inputs"]:
            j = self.FEATURES.index(t["name"])
            col = self.ds.rows64[:, j] if t["datatype"] == "FP64" else X[:, j]
            shape = [len(X)] + [1] * (len(t["shape"]) - 1)
            inputs.append({"name": t["name"], "datatype": t["datatype"], "shape": shape,
                           "data": _jsonable(col)})
        X32 = self.ds.rows64.astype(np.float32)
        self.check_oip_predict(self.oip({"inputs": inputs}), X32)

    def test_mlflow_instances_as_records(self):
        X = self.ds.rows[:5]
        recs = [dict(zip(self.FEATURES, row)) for row in _jsonable(X)]
        self.check_mlflow(self.mlflow({"instances": recs}), X)

    def test_mlflow_inputs_columnar_dict(self):
        X = self.ds.rows
        cols = {n: _jsonable(X[:, j]) for j, n in enumerate(self.FEATURES)}
        self.check_mlflow(self.mlflow({"inputs": cols}), X)

    def test_mlflow_csv_reordered_columns(self):
        X = self.ds.rows
        order = [3, 1, 0, 2]
        body = csv_body(X[:, order], [self.FEATURES[j] for j in order])
        self.check_mlflow(self.mlflow(body, "text/csv"), X)


class ParityBinaryJson(_ParityMixin, ReplicaTestCase):
    MODEL, NAME, DATA = "binary.json", "binary", "breast_cancer"


class ParityMulticlassUbj(_NamedParityMixin, ReplicaTestCase):
    MODEL, NAME, DATA = "multiclass.ubj", "multiclass", "iris"
    FEATURES = IRIS_FEATURES


class ParityRegressionJson(_ParityMixin, ReplicaTestCase):
    MODEL, NAME, DATA = "regression.json", "regression", "diabetes"


class ParityMlflowClassifier(_NamedParityMixin, ReplicaTestCase):
    MODEL, NAME, DATA = "mlflow_classifier", "mlflow_classifier", "iris"
    FEATURES = IRIS_FEATURES
    KIND = "classifier"

    def test_oip_predict_proba_only(self):
        X = self.ds.rows
        body = oip_body(X)
        body["outputs"] = [{"name": "predict_proba"}]
        j = self.assertJsonOk(self.oip(body))
        self.assertEqual([o["name"] for o in j["outputs"]], ["predict_proba"], j)
        proba = self.expected_proba(X)
        self.assertOipTensor(j["outputs"][0], [len(X), 3], "FP32", proba)

    def test_oip_both_outputs_requested(self):
        X = self.ds.rows[:3]
        body = oip_body(X)
        body["outputs"] = [{"name": "predict_proba"}, {"name": "predict"}]
        j = self.assertJsonOk(self.oip(body))
        self.assertEqual(sorted(o["name"] for o in j["outputs"]), ["predict", "predict_proba"])


class ParityMlflowBooster(_ParityMixin, ReplicaTestCase):
    MODEL, NAME, DATA = "mlflow_booster", "mlflow_booster", "breast_cancer"


class ParityMlflowBinaryClassifier(_ParityMixin, ReplicaTestCase):
    """XGBClassifier, 2 classes: predict_proba has 2 columns."""
    MODEL, NAME, DATA = ("mlflow_binary_classifier", "mlflow_binary_classifier",
                         "breast_cancer")
    KIND = "classifier"
    CLASSES = 2


class ParityMlflowRegressor(_ParityMixin, ReplicaTestCase):
    MODEL, NAME, DATA = "mlflow_regressor", "mlflow_regressor", "diabetes"


# --------------------------------------------------------------------------- server routes

class ServerRoutes(ReplicaTestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(cls, model_path("binary.json"), cls_level=True)

    def get(self, path):
        return req(self.srv.port, "GET", path)

    def test_health_live(self):
        self.assertEqual(self.assertJsonOk(self.get("/v2/health/live")), {"live": True})

    def test_health_ready(self):
        self.assertEqual(self.assertJsonOk(self.get("/v2/health/ready")), {"ready": True})

    def test_server_metadata(self):
        j = self.assertJsonOk(self.get("/v2"))
        self.assertEqual(j.get("name"), "flotilla", j)
        self.assertIsInstance(j.get("version"), str, j)
        self.assertTrue(j["version"], j)
        self.assertIsInstance(j.get("extensions"), list, j)

    def test_ping_and_health(self):
        for p in ("/ping", "/health"):
            r = self.get(p)
            self.assertEqual(r.status, 200, (p, r))
            self.assertEqual(r.body, b"\n", (p, r))

    def test_version(self):
        r = self.get("/version")
        self.assertEqual(r.status, 200, r)
        self.assertRegex(r.body.decode(), r"\d+\.\d+")
        meta = self.assertJsonOk(self.get("/v2"))
        self.assertIn(meta["version"], r.body.decode())

    def test_head_or_query_string_do_not_break_routing(self):
        r = self.get("/v2/health/live?x=1")
        self.assertEqual(r.status, 200, r)

    def test_keep_alive_many_requests_one_connection(self):
        ds = dataset("breast_cancer")
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=HTTP_TIMEOUT_S)
        self.addCleanup(conn.close)
        local = None
        for i in range(150):
            k = i % 3
            X = ds.X32[i:i + 1]
            if k == 0:
                r = req(0, "POST", "/v2/models/binary/infer", oip_body(X), conn=conn)
                j = self.assertJsonOk(r)
                self.assertClose(flatten(j["outputs"][0]["data"]),
                                 booster_predict("binary.json", X))
            elif k == 1:
                r = req(0, "POST", "/invocations", {"instances": _jsonable(X)}, conn=conn)
                self.assertClose(self.assertJsonOk(r)["predictions"],
                                 booster_predict("binary.json", X))
            else:
                r = req(0, "GET", "/v2/health/ready", conn=conn)
                self.assertEqual(r.status, 200)
            self.assertNotEqual(r.headers.get("connection", "").lower(), "close", r)
            self.assertIsNotNone(conn.sock, f"connection closed after request {i}")
            name = conn.sock.getsockname()
            if local is None:
                local = name
            self.assertEqual(name, local, f"new connection opened at request {i}")

    def test_pipelined_requests(self):
        ds = dataset("breast_cancer")
        X = ds.X32[:3]
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        reqs = [raw_request("GET", "/v2/health/live"),
                raw_request("POST", "/v2/models/binary/infer", oip_body(X[0:1])),
                raw_request("POST", "/invocations", {"instances": _jsonable(X[1:3])}),
                raw_request("GET", "/ping")]
        c.send(b"".join(reqs))
        r = [c.read_response() for _ in reqs]
        self.assertEqual([x.status for x in r], [200, 200, 200, 200], r)
        self.assertEqual(r[0].json(), {"live": True})
        self.assertClose(flatten(r[1].json()["outputs"][0]["data"]),
                         booster_predict("binary.json", X[0:1]))
        self.assertClose(r[2].json()["predictions"], booster_predict("binary.json", X[1:3]))
        self.assertEqual(r[3].body, b"\n")

    def test_connection_close_honoured(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(raw_request("GET", "/v2/health/live", keep_alive=False))
        r = c.read_response()
        self.assertEqual(r.status, 200)
        closed, _, _ = c.wait_closed(5)
        self.assertTrue(closed, "server kept the connection after Connection: close")

    def test_chunked_request_body(self):
        X = dataset("breast_cancer").rows[:5]
        for path, body, key in (("/v2/models/binary/infer", oip_body(X), "oip"),
                                ("/invocations", {"instances": _jsonable(X)}, "mlflow")):
            data = json.dumps(body).encode()
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + 100]), data[i:i + 100])
                              for i in range(0, len(data), 100)) + b"0\r\n\r\n"
            c = RawConn(self.srv.port)
            self.addCleanup(c.close)
            c.send(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Transfer-Encoding: chunked\r\n\r\n".encode() + chunks)
            r = c.read_response()
            j = self.assertJsonOk(r)
            got = flatten(j["outputs"][0]["data"]) if key == "oip" else j["predictions"]
            self.assertClose(got, booster_predict("binary.json", X), key)

    def test_expect_100_continue(self):
        X = dataset("breast_cancer").rows[:2]
        data = json.dumps(oip_body(X)).encode()
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(f"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
               f"Expect: 100-continue\r\n\r\n".encode())
        # a client may wait for "100 Continue" or send the body after a pause; send it
        # once the interim response arrives or after 1 s, whichever is first
        r, _, _ = select.select([c.sock], [], [], 1.0)
        if r:
            c._fill()
            if c.buf.startswith(b"HTTP/1.1 100"):
                c._read_until(b"\r\n\r\n")
        c.send(data)
        j = self.assertJsonOk(c.read_response())
        self.assertClose(flatten(j["outputs"][0]["data"]), booster_predict("binary.json", X))

    def test_oversized_header_rejected(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n")
        closed, _, data = c.wait_closed(5)
        self.assertTrue(closed, "connection with a 200 KB header left open")
        if data:
            self.assertRegex(data, rb"^HTTP/1\.1 4\d\d ")

    def test_json_formatting_variants(self):
        X = dataset("breast_cancer").rows[:3]
        exp = booster_predict("binary.json", X)
        # pretty-printed, keys reordered, integers and exponents in FP32 data
        body = {"outputs": [{"name": "predict"}], "id": "fmt",
                "inputs": [{"data": _jsonable(X), "datatype": "FP32", "shape": [3, 30],
                            "name": "x"}]}
        j = self.assertJsonOk(req(self.srv.port, "POST", "/v2/models/binary/infer",
                                  json.dumps(body, indent=2).encode(),
                                  headers={"Content-Type": "application/json"}))
        self.assertClose(flatten(j["outputs"][0]["data"]), exp)
        Xi = np.floor(X)
        data = ",".join(str(int(v)) if i % 2 else f"{v:.6e}"
                        for i, v in enumerate(Xi.reshape(-1)))
        raw = ('{"inputs":[{"name":"x","shape":[3,30],"datatype":"FP32","data":[' + data +
               ']}]}').encode()
        j = self.assertJsonOk(req(self.srv.port, "POST", "/v2/models/binary/infer", raw,
                                  headers={"Content-Type": "application/json"}))
        self.assertClose(flatten(j["outputs"][0]["data"]),
                         booster_predict("binary.json", Xi.astype(np.float32)))

    def test_mlflow_content_type_variants(self):
        X = dataset("breast_cancer").rows[:2]
        exp = booster_predict("binary.json", X)
        for ct in ("application/json;charset=UTF-8", "application/json; charset=utf-8",
                   "Application/JSON"):
            r = req(self.srv.port, "POST", "/invocations", {"instances": _jsonable(X)},
                    headers={"Content-Type": ct})
            self.assertClose(self.assertJsonOk(r)["predictions"], exp, ct)

    def test_mlflow_csv_crlf_and_quoted_header(self):
        X = dataset("breast_cancer").rows[:3]
        body = (",".join(f'"c{i}"' for i in range(30)) + "\r\n" +
                "\r\n".join(",".join(repr(float(v)) for v in row) for row in X) + "\r\n")
        r = req(self.srv.port, "POST", "/invocations", body.encode(),
                headers={"Content-Type": "text/csv"})
        self.assertClose(self.assertJsonOk(r)["predictions"], booster_predict("binary.json", X))

    def test_many_open_connections(self):
        conns = []
        for _ in range(200):
            c = RawConn(self.srv.port)
            self.addCleanup(c.close)
            conns.append(c)
        for c in conns:
            c.send(raw_request("GET", "/v2/health/ready"))
        for c in conns:
            self.assertEqual(c.read_response().status, 200)

    def test_http10_request(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        r = c.read_response()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json(), {"live": True})


class ServerOptions(ReplicaTestCase):
    def test_name_flag(self):
        srv = start_server(self, model_path("binary.json"), "--name", "fraud")
        self.assertEqual(srv.name, "fraud")
        X = dataset("breast_cancer").rows[:2]
        j = self.assertJsonOk(req(srv.port, "POST", "/v2/models/fraud/infer", oip_body(X)))
        self.assertEqual(j["model_name"], "fraud")
        self.assertClose(flatten(j["outputs"][0]["data"]), booster_predict("binary.json", X))
        self.assertEqual(req(srv.port, "POST", "/v2/models/binary/infer", oip_body(X)).status,
                         404)
        self.assertEqual(self.assertJsonOk(req(srv.port, "GET", "/v2/models/fraud"))["name"],
                         "fraud")

    def test_small_max_batch_size_large_request(self):
        srv = start_server(self, model_path("multiclass.ubj"), "--max-batch-size", "8",
                           "--workers", "1", "--predict-threads", "2")
        X = dataset("iris").X32
        j = self.assertJsonOk(req(srv.port, "POST", "/v2/models/multiclass/infer",
                                  oip_body(X)))
        self.assertClose(np.asarray(flatten(j["outputs"][0]["data"])).reshape(-1, 3),
                         booster_predict("multiclass.ubj", X))
        r = req(srv.port, "POST", "/invocations", {"instances": _jsonable(X)})
        self.assertClose(self.assertJsonOk(r)["predictions"], booster_predict("multiclass.ubj", X))

    def test_explicit_runtime_xgboost(self):
        srv = start_server(self, model_path("regression.json"), "--runtime", "xgboost")
        X = dataset("diabetes").rows
        j = self.assertJsonOk(req(srv.port, "POST", "/v2/models/regression/infer", oip_body(X)))
        self.assertClose(flatten(j["outputs"][0]["data"]), booster_predict("regression.json", X))


# --------------------------------------------------------------------------- bad input

class BadInput(ReplicaTestCase):
    """Each bad request gets the right code and error shape, and the server then still
    answers a good request correctly."""

    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(cls, model_path("binary.json"), cls_level=True)
        cls.ds = dataset("breast_cancer")
        cls.F = cls.ds.n_features

    def tearDown(self):
        # the server must be unharmed by whatever the test sent
        self.assertTrue(self.srv.alive(), f"server died:\n{self.srv.stderr()}")
        X = self.ds.rows[:4]
        j = self.assertJsonOk(self.infer(oip_body(X)))
        self.assertClose(flatten(j["outputs"][0]["data"]), booster_predict("binary.json", X))
        j = self.assertJsonOk(self.invoc({"instances": _jsonable(X)}))
        self.assertClose(j["predictions"], booster_predict("binary.json", X))

    def infer(self, body, headers=None, path="/v2/models/binary/infer"):
        return req(self.srv.port, "POST", path, body,
                    headers=headers or {"Content-Type": "application/json"})

    def invoc(self, body, content_type="application/json"):
        return req(self.srv.port, "POST", "/invocations", body,
                    headers={"Content-Type": content_type})

    def row(self, n=1):
        return self.ds.rows[:n]

    # -- OIP
    def test_oip_malformed_json(self):
        self.assertOipError(self.infer(b'{"inputs": ['), 400)
        self.assertOipError(self.infer(b'{"inputs": [{"name": "x", }]}'), 400)
        self.assertOipError(self.infer(b'not json at all'), 400)

    def test_oip_empty_body(self):
        self.assertOipError(self.infer(b""), 400)

    def test_oip_body_not_an_object(self):
        self.assertOipError(self.infer(b"[1, 2, 3]"), 400)
        self.assertOipError(self.infer(b'"inputs"'), 400)

    def test_oip_invalid_utf8(self):
        body = json.dumps(oip_body(self.row())).encode().replace(b'"input-0"', b'"in\xff\xfe"')
        self.assertOipError(self.infer(body), 400)

    def test_oip_missing_inputs(self):
        self.assertOipError(self.infer({}), 400)
        self.assertOipError(self.infer({"inputs": None}), 400)
        self.assertOipError(self.infer({"inputs": {"name": "x"}}), 400)

    def test_oip_empty_inputs(self):
        self.assertOipError(self.infer({"inputs": []}), 400)

    def test_oip_zero_rows(self):
        body = {"inputs": [{"name": "x", "shape": [0, self.F], "datatype": "FP32", "data": []}]}
        self.assertOipError(self.infer(body), 400)

    def test_oip_unknown_datatype(self):
        body = oip_body(self.row())
        body["inputs"][0]["datatype"] = "FP33"
        self.assertOipError(self.infer(body), 400)

    def test_oip_missing_fields(self):
        for field in ("datatype", "shape", "data"):
            body = oip_body(self.row())
            del body["inputs"][0][field]
            self.assertOipError(self.infer(body), 400)

    def test_oip_string_element_in_fp32(self):
        body = oip_body(self.row())
        body["inputs"][0]["data"][3] = "1.5"
        self.assertOipError(self.infer(body), 400)

    def test_oip_fraction_in_int32(self):
        X = np.round(self.row())
        body = oip_body(X, datatype="INT32")
        body["inputs"][0]["data"] = [int(v) for v in X.reshape(-1)]
        body["inputs"][0]["data"][0] = 1.5
        self.assertOipError(self.infer(body), 400)

    def test_oip_bool_in_fp32_or_number_in_bool(self):
        body = oip_body(self.row())
        body["inputs"][0]["datatype"] = "BOOL"
        self.assertOipError(self.infer(body), 400)   # 17.99 is not a boolean

    def test_oip_integer_and_bool_datatypes_ok(self):
        X = np.round(self.ds.rows[:3]).astype(np.int64)
        for dt in ("INT32", "INT64"):
            body = {"inputs": [{"name": "x", "shape": list(X.shape), "datatype": dt,
                                "data": X.reshape(-1).tolist()}]}
            j = self.assertJsonOk(self.infer(body))
            self.assertClose(flatten(output_by_name(j, "predict")["data"]),
                             booster_predict("binary.json", X.astype(np.float32)), dt)
        B = (self.ds.rows[:2] > np.median(self.ds.X32, axis=0))
        body = {"inputs": [{"name": "x", "shape": list(B.shape), "datatype": "BOOL",
                            "data": B.reshape(-1).tolist()}]}
        j = self.assertJsonOk(self.infer(body))
        self.assertClose(flatten(output_by_name(j, "predict")["data"]),
                         booster_predict("binary.json", B.astype(np.float32)), "BOOL")

    def test_oip_shape_data_length_mismatch(self):
        X = self.row(2)
        body = oip_body(X)
        body["inputs"][0]["data"] = body["inputs"][0]["data"][:self.F]   # shape says 2 rows
        self.assertOipError(self.infer(body), 400)
        body = oip_body(X)
        body["inputs"][0]["shape"] = [1, self.F]                         # data has 2 rows
        self.assertOipError(self.infer(body), 400)

    def test_oip_ragged_nested_data(self):
        body = oip_body(self.row(2), nested=True)
        body["inputs"][0]["data"][1] = body["inputs"][0]["data"][1][:-1]
        body["inputs"][0]["data"][0].append(1.0)   # total count still matches
        self.assertOipError(self.infer(body), 400)

    def test_oip_wrong_feature_count(self):
        for nf in (self.F - 1, self.F + 1, 1):
            X = np.ones((2, nf), dtype=np.float32)
            self.assertOipError(self.infer(oip_body(X)), 400)

    def test_oip_bad_shapes(self):
        for shape in ([-1, self.F], [1, -self.F], [2 ** 32, 2 ** 32], [2 ** 62, 4],
                      [1, self.F, 1, 1], [], "30", [1.5, self.F], [None, self.F]):
            body = oip_body(self.row())
            body["inputs"][0]["shape"] = shape
            self.assertOipError(self.infer(body), 400)

    def test_oip_huge_number_and_nan_literals(self):
        body = json.dumps(oip_body(self.row())).encode()
        bad = re.sub(rb"\d+\.\d+", b"1e999", body, count=1)
        r = self.infer(bad)
        self.assertIn(r.status, (200, 400), r)        # inf is a float; either is fine
        self.assertIsInstance(r.json(), dict)
        bad = re.sub(rb"\d+\.\d+", b"NaN", body, count=1)   # not JSON
        self.assertOipError(self.infer(bad), 400)

    def test_oip_deeply_nested_json(self):
        depth = 100000
        body = b'{"inputs": [{"name": "x", "shape": [1, 30], "datatype": "FP32", "data": ' + \
            b"[" * depth + b"]" * depth + b"}]}"
        self.assertOipError(self.infer(body), 400)
        self.assertOipError(self.infer(b"[" * depth), 400)

    def test_oip_unknown_model(self):
        r = self.infer(oip_body(self.row()), path="/v2/models/nosuch/infer")
        self.assertOipError(r, 404)
        self.assertOipError(req(self.srv.port, "GET", "/v2/models/nosuch"), 404)
        self.assertOipError(req(self.srv.port, "GET", "/v2/models/nosuch/ready"), 404)

    def test_unknown_route(self):
        for method, path in (("GET", "/nope"), ("GET", "/v2/models"), ("POST", "/v2/foo"),
                             ("GET", "/v2/models/binary/bogus"), ("GET", "/v3"),
                             ("POST", "/invocations/extra"), ("GET", "/")):
            r = req(self.srv.port, method, path, b"{}" if method == "POST" else None)
            self.assertOipError(r, 404)

    def test_openai_routes_on_a_tabular_model(self):
        for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                             ("GET", "/v1/models")):
            r = req(self.srv.port, method, path, b"{}" if method == "POST" else None)
            self.assertEqual(r.status, 404, r)
            self.assertIn("not a language model", r.json()["error"]["message"])

    def test_wrong_method(self):
        for method, path, allow in (("GET", "/invocations", "POST"),
                                    ("GET", "/v2/models/binary/infer", "POST"),
                                    ("POST", "/v2/health/live", "GET"),
                                    ("DELETE", "/v2/models/binary", "GET"),
                                    ("PUT", "/metrics", "GET"),
                                    ("POST", "/ping", "GET")):
            r = req(self.srv.port, method, path, b"{}" if method in ("POST", "PUT") else None)
            self.assertOipError(r, 405)
            self.assertIn("allow", r.headers, (method, path, r))
            self.assertIn(allow, [a.strip() for a in r.headers["allow"].split(",")],
                          (method, path, r))

    # -- MLflow
    def test_mlflow_malformed_json(self):
        self.assertMlflowError(self.invoc(b'{"instances": [[1, 2'))
        self.assertMlflowError(self.invoc(b'{instances: 1}'))

    def test_mlflow_no_format_key(self):
        self.assertMlflowError(self.invoc({}))
        self.assertMlflowError(self.invoc({"params": {}}))
        self.assertMlflowError(self.invoc({"data": _jsonable(self.row())}))

    def test_mlflow_two_format_keys(self):
        X = _jsonable(self.row())
        self.assertMlflowError(self.invoc({"instances": X, "inputs": X}))
        self.assertMlflowError(self.invoc({
            "dataframe_split": {"columns": positional_names(self.F), "data": X},
            "dataframe_records": [dict(zip(positional_names(self.F), X[0]))]}))

    def test_mlflow_top_level_list(self):
        self.assertMlflowError(self.invoc(_jsonable(self.row())))
        self.assertMlflowError(self.invoc(b"[]"))

    def test_mlflow_text_plain_is_415(self):
        r = self.invoc(json.dumps({"instances": _jsonable(self.row())}), "text/plain")
        self.assertMlflowError(r, 415)

    def test_mlflow_other_content_types_are_415(self):
        body = json.dumps({"instances": _jsonable(self.row())})
        for ct in ("application/x-www-form-urlencoded", "application/octet-stream",
                   "application/jsonx"):
            self.assertMlflowError(self.invoc(body, ct), 415)

    def test_mlflow_bad_charset_is_415(self):
        body = json.dumps({"instances": _jsonable(self.row())})
        self.assertMlflowError(self.invoc(body, "application/json; charset=latin-1"), 415)
        self.assertMlflowError(self.invoc(body, "application/json; charset=utf-16"), 415)

    def test_mlflow_wrong_feature_count(self):
        X = np.ones((2, self.F - 1), dtype=np.float32)
        self.assertMlflowError(self.invoc({"instances": _jsonable(X)}))
        self.assertMlflowError(self.invoc({"inputs": _jsonable(X)}))
        self.assertMlflowError(self.invoc(
            {"dataframe_split": {"columns": positional_names(self.F - 1), "data": _jsonable(X)}}))
        self.assertMlflowError(self.invoc(csv_body(X, positional_names(self.F - 1)), "text/csv"))

    def test_mlflow_empty_input(self):
        self.assertMlflowError(self.invoc({"instances": []}))
        self.assertMlflowError(self.invoc({"inputs": []}))
        self.assertMlflowError(self.invoc(
            {"dataframe_split": {"columns": positional_names(self.F), "data": []}}))
        self.assertMlflowError(self.invoc({"dataframe_records": []}))
        self.assertMlflowError(self.invoc(",".join(positional_names(self.F)) + "\n", "text/csv"))
        self.assertMlflowError(self.invoc(b"", "text/csv"))

    def test_mlflow_non_numeric_values(self):
        X = _jsonable(self.row(2))
        X[1][4] = "abc"
        self.assertMlflowError(self.invoc({"instances": X}))
        X[1][4] = {"a": 1}
        self.assertMlflowError(self.invoc({"inputs": X}))
        csv = csv_body(self.row(2), positional_names(self.F)).replace(b",", b",abc,", 1)
        self.assertMlflowError(self.invoc(csv, "text/csv"))

    def test_mlflow_ragged_rows(self):
        X = _jsonable(self.row(3))
        X[1] = X[1][:-1]
        self.assertMlflowError(self.invoc({"instances": X}))
        self.assertMlflowError(self.invoc(
            {"dataframe_split": {"columns": positional_names(self.F), "data": X}}))

    def test_mlflow_dataframe_split_missing_data(self):
        self.assertMlflowError(self.invoc(
            {"dataframe_split": {"columns": positional_names(self.F)}}))
        self.assertMlflowError(self.invoc({"dataframe_split": [1, 2]}))


class BodyLimit(ReplicaTestCase):
    LIMIT = 2048

    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(cls, model_path("binary.json"), "--max-body-bytes",
                               str(cls.LIMIT), cls_level=True)
        cls.ds = dataset("breast_cancer")

    def good(self):
        X = self.ds.rows[:1]
        j = self.assertJsonOk(req(self.srv.port, "POST", "/v2/models/binary/infer",
                                   oip_body(X)))
        self.assertClose(flatten(j["outputs"][0]["data"]), booster_predict("binary.json", X))

    def test_small_body_ok(self):
        self.assertLess(len(json.dumps(oip_body(self.ds.rows[:1]))), self.LIMIT)
        self.good()

    def _over_limit(self, path):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        # Declare a large body but send only part of it (still over the limit): the
        # server must answer 413 without waiting for the rest, then close.
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: 200000\r\n\r\n").encode()
        c.send(head + b"[" + b"1," * 2500)
        r = c.read_response()
        self.assertOipError(r, 413)
        closed, secs, _ = c.wait_closed(5)
        self.assertTrue(closed, "connection not closed after 413")
        self.good()

    def test_oip_body_over_limit_413(self):
        self._over_limit("/v2/models/binary/infer")

    def test_mlflow_body_over_limit_413(self):
        self._over_limit("/invocations")

    def test_chunked_body_over_limit_413(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + (b"400\r\n" + b" " * 1024 + b"\r\n") * 4)
        r = c.read_response()
        self.assertEqual(r.status, 413, r)
        self.assertIsInstance(r.json().get("error"), str, r)
        self.good()

    def test_full_body_over_limit_413(self):
        body = json.dumps(oip_body(self.ds.rows)).encode()   # ~12 KB, all sent
        self.assertGreater(len(body), self.LIMIT)
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", "/v2/models/binary/infer", body))
        self.assertOipError(c.read_response(), 413)
        self.good()


# --------------------------------------------------------------------------- slow clients

class SlowClients(ReplicaTestCase):
    T_MS = 300
    CLOSE_DEADLINE_S = 5.0

    @classmethod
    def setUpClass(cls):
        t = str(cls.T_MS)
        cls.srv = start_server(cls, model_path("binary.json"), "--header-timeout-ms", t,
                               "--body-timeout-ms", t, "--idle-timeout-ms", t,
                               cls_level=True)
        cls.ds = dataset("breast_cancer")

    def tearDown(self):
        self.assertTrue(self.srv.alive(), f"server died:\n{self.srv.stderr()}")
        self.assertJsonOk(req(self.srv.port, "GET", "/v2/health/ready"))

    def assertClosedInTime(self, c, what):
        closed, secs, data = c.wait_closed(self.CLOSE_DEADLINE_S)
        self.assertTrue(closed, f"{what}: connection still open after "
                                f"{self.CLOSE_DEADLINE_S}s (got {data[:200]!r})")
        # not before the configured timeout (some slack for timer granularity)
        self.assertGreaterEqual(secs, self.T_MS / 1000 * 0.5, f"{what}: closed too early")
        if data:
            self.assertRegex(data, rb"^HTTP/1\.1 (408|400) ", f"{what}: unexpected bytes")
        return secs

    def test_stalled_header_is_closed(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\nContent-Ty")
        self.assertClosedInTime(c, "half header")

    def test_connect_and_send_nothing_is_closed(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        self.assertClosedInTime(c, "silent connection")

    def test_trickled_header_is_closed(self):
        # slowloris: one byte every 50 ms never completes the header; the header
        # timeout is for the whole header, not per read.
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        t0 = time.monotonic()
        header = b"GET /v2/health/live HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 200
        closed = False
        for b in header:
            try:
                c.send(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            r, _, _ = select.select([c.sock], [], [], 0.05)   # pace the trickle
            if r:
                closed, _, _ = c.wait_closed(0.5)
                if closed:
                    break
            if time.monotonic() - t0 > self.CLOSE_DEADLINE_S:
                break
        if not closed:
            closed, _, _ = c.wait_closed(1.0)
        self.assertTrue(closed, "trickled header kept the connection open")
        self.assertLess(time.monotonic() - t0, self.CLOSE_DEADLINE_S + 1.5)

    def test_stalled_body_is_closed(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(b"POST /v2/models/binary/infer HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"inputs\": [")
        self.assertClosedInTime(c, "stalled body")

    def test_idle_keep_alive_is_closed(self):
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        c.send(raw_request("GET", "/v2/health/live"))
        r = c.read_response()
        self.assertEqual(r.status, 200)
        self.assertClosedInTime(c, "idle keep-alive")

    def test_active_keep_alive_survives_longer_than_timeouts(self):
        # requests 100 ms apart on one connection, for > 3x the timeouts
        c = RawConn(self.srv.port)
        self.addCleanup(c.close)
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 3 * self.T_MS / 1000:
            c.send(raw_request("GET", "/v2/health/live"))
            self.assertEqual(c.read_response().status, 200, f"request {n}")
            n += 1
            select.select([], [], [], 0.1)   # pace the requests
        self.assertGreater(n, 3)

    def test_garbage_request_line(self):
        # answered with 4xx at once, or closed by the header timeout at the latest
        for junk in (b"HELLO\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                     b"GET /ping HTTP/9.9\r\n\r\n", b"GET  HTTP/1.1\r\n\r\n"):
            c = RawConn(self.srv.port)
            self.addCleanup(c.close)
            c.send(junk)
            closed, _, data = c.wait_closed(self.CLOSE_DEADLINE_S)
            self.assertTrue(closed, f"connection left open after {junk!r}")
            if data:
                self.assertRegex(data, rb"^HTTP/1\.[01] [45]\d\d ", junk)
        self.assertJsonOk(req(self.srv.port, "GET", "/v2/health/live"))

    def test_other_clients_served_while_one_stalls(self):
        stalled = []
        for _ in range(8):
            c = RawConn(self.srv.port)
            self.addCleanup(c.close)
            c.send(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            stalled.append(c)
        X = self.ds.rows[:2]
        t0 = time.monotonic()
        j = self.assertJsonOk(req(self.srv.port, "POST", "/invocations",
                                   {"instances": _jsonable(X)}))
        self.assertLess(time.monotonic() - t0, self.T_MS / 1000,
                        "a good request waited behind stalled connections")
        self.assertClose(j["predictions"], booster_predict("binary.json", X))
        for c in stalled:
            closed, _, _ = c.wait_closed(self.CLOSE_DEADLINE_S)
            self.assertTrue(closed)


# --------------------------------------------------------------------------- concurrency

class Concurrency(ReplicaTestCase):
    THREADS = 64
    PER_THREAD = 4

    def run_clients(self, *flags):
        srv = start_server(self, model_path("binary.json"), *flags)
        ds = dataset("breast_cancer")
        X = ds.X32
        n = len(X)
        barrier = threading.Barrier(self.THREADS, timeout=20)

        def client(w):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=HTTP_TIMEOUT_S)
            out = []
            try:
                barrier.wait()
                for k in range(self.PER_THREAD):
                    start = ((w * self.PER_THREAD + k) * 2) % n
                    rows = 1 + (w + k) % 3
                    idx = [(start + i) % n for i in range(rows)]
                    if k % 2 == 0:
                        r = req(0, "POST", "/v2/models/binary/infer",
                                 oip_body(X[idx]), conn=conn)
                        got = (flatten(r.json()["outputs"][0]["data"])
                               if r.status == 200 else None)
                    else:
                        r = req(0, "POST", "/invocations",
                                 {"instances": _jsonable(X[idx])}, conn=conn)
                        got = r.json()["predictions"] if r.status == 200 else None
                    out.append((idx, r.status, got, r.body[:300]))
            finally:
                conn.close()
            return out

        with concurrent.futures.ThreadPoolExecutor(self.THREADS) as ex:
            results = [f.result(timeout=60) for f in
                       [ex.submit(client, w) for w in range(self.THREADS)]]
        expected_all = booster_predict("binary.json", X)
        count = 0
        for res in results:
            self.assertEqual(len(res), self.PER_THREAD)
            for idx, status, got, body in res:
                self.assertEqual(status, 200, body)
                self.assertClose(got, expected_all[idx], f"rows {idx}")
                count += 1
        self.assertEqual(count, self.THREADS * self.PER_THREAD)
        return srv

    def test_concurrent_default_flags(self):
        self.run_clients()

    def test_concurrent_no_batching(self):
        self.run_clients("--no-batching")

    def test_concurrent_batching_with_queue_delay(self):
        srv = self.run_clients("--max-queue-delay-us", "2000", "--max-batch-size", "8")
        m = parse_metrics(req(srv.port, "GET", "/metrics").body.decode())
        cnt = sum(v for (n, _), v in m.items() if n == "flotilla_replica_batch_rows_count")
        tot = sum(v for (n, _), v in m.items() if n == "flotilla_replica_batch_rows_sum")
        self.assertGreater(cnt, 0, "batch_rows histogram has no observations")
        # 64 threads x 4 requests x 2 rows on average
        self.assertEqual(tot, sum(1 + (w + k) % 3 for w in range(self.THREADS)
                                  for k in range(self.PER_THREAD)))


# --------------------------------------------------------------------------- metrics

def counter_by_code(samples, name="flotilla_replica_requests_total"):
    by = {}
    for (n, labels), v in samples.items():
        if n == name:
            code = dict(labels).get("code")
            by[code] = by.get(code, 0) + v
    return by


class Metrics(ReplicaTestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(cls, model_path("binary.json"), cls_level=True)
        cls.ds = dataset("breast_cancer")

    def metrics(self):
        r = req(self.srv.port, "GET", "/metrics")
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("text/plain"), r.headers)
        return r.body.decode("utf-8")

    def traffic(self):
        p = self.srv.port
        for i in range(5):
            self.assertJsonOk(req(p, "POST", "/v2/models/binary/infer",
                                   oip_body(self.ds.rows[i:i + 2])))
        for i in range(3):
            self.assertJsonOk(req(p, "POST", "/invocations",
                                   {"instances": _jsonable(self.ds.rows[i:i + 1])}))
        for _ in range(2):
            self.assertEqual(req(p, "POST", "/v2/models/binary/infer", b"{").status, 400)
        self.assertEqual(req(p, "GET", "/nope").status, 404)
        self.assertEqual(req(p, "GET", "/invocations").status, 405)

    def test_metrics_content_and_counts(self):
        before = counter_by_code(parse_metrics(self.metrics()))
        self.traffic()
        text = self.metrics()
        samples = parse_metrics(text)
        after = counter_by_code(samples)
        self.assertIn("flotilla_replica_requests_total{", text)
        for (n, labels), _ in samples.items():
            if n == "flotilla_replica_requests_total":
                keys = dict(labels)
                self.assertIn("route", keys, labels)
                self.assertIn("code", keys, labels)
        self.assertGreaterEqual(after.get("200", 0) - before.get("200", 0), 8, after)
        self.assertGreaterEqual(after.get("400", 0) - before.get("400", 0), 2, after)
        self.assertGreaterEqual(after.get("404", 0) - before.get("404", 0), 1, after)
        self.assertGreaterEqual(after.get("405", 0) - before.get("405", 0), 1, after)
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        want = {"flotilla_replica_requests_total": "counter",
                "flotilla_replica_request_duration_seconds": "histogram",
                "flotilla_replica_in_flight_requests": "gauge",
                "flotilla_replica_batch_rows": "histogram",
                "flotilla_replica_model_load_seconds": "gauge",
                "process_cpu_seconds_total": "counter",
                "process_resident_memory_bytes": "gauge",
                "process_virtual_memory_bytes": "gauge",
                "process_open_fds": "gauge",
                "process_start_time_seconds": "gauge"}
        for name, typ in want.items():
            self.assertEqual(types.get(name), typ, f"# TYPE for {name}")
        durations = [v for (n, _), v in samples.items()
                     if n == "flotilla_replica_request_duration_seconds_count"]
        self.assertGreaterEqual(sum(durations), 10)
        for (n, labels), v in samples.items():
            if n == "flotilla_replica_request_duration_seconds_bucket":
                self.assertIn("route", dict(labels))
        load = [v for (n, _), v in samples.items() if n == "flotilla_replica_model_load_seconds"]
        self.assertEqual(len(load), 1)
        self.assertGreater(load[0], 0)
        rss = [v for (n, _), v in samples.items() if n == "process_resident_memory_bytes"]
        self.assertGreater(rss[0], 1e6)
        start = [v for (n, _), v in samples.items() if n == "process_start_time_seconds"]
        self.assertLess(abs(start[0] - time.time()), 3600)

    def test_promtool_check_metrics(self):
        self.traffic()
        body = self.metrics()
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=body.encode(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        self.assertEqual(p.returncode, 0,
                         f"promtool check metrics failed:\n{p.stdout.decode()}\n"
                         f"--- metrics body ---\n{body[:4000]}")


# --------------------------------------------------------------------------- drain

def in_flight(port):
    try:
        text = req(port, "GET", "/metrics", timeout=2).body.decode()
    except OSError:
        return -1
    for (n, _), v in parse_metrics(text).items():
        if n == "flotilla_replica_in_flight_requests":
            return v
    return -1


def write_yaml(name, text):
    return harness.write_yaml(_tmp_root, name, text)


class Drain(ReplicaTestCase):
    def test_sigterm_drains_in_flight_requests(self):
        model = write_yaml("drain.yaml", "service_time: {dist: fixed, mean_ms: 700}\n"
                                         "cpu_us: 0\nsaturation: 1000\n")
        srv = start_server(self, model, "--runtime", "synthetic")
        name = srv.name
        N = 8
        base = in_flight(srv.port)   # 1 if the gauge counts the scrape itself, else 0
        self.assertIn(base, (0, 1), "in-flight gauge of an idle server")
        # an idle keep-alive connection
        idle = RawConn(srv.port)
        self.addCleanup(idle.close)
        idle.send(raw_request("GET", "/ping"))
        self.assertEqual(idle.read_response().status, 200)
        conns = []
        for i in range(N):
            c = RawConn(srv.port)
            self.addCleanup(c.close)
            c.send(raw_request("POST", f"/v2/models/{name}/infer",
                               oip_body(np.zeros((i + 1, 3), np.float32))))
            conns.append(c)
        wait_until(lambda: in_flight(srv.port) >= N + base, 5,
                   what=f"{N} requests in flight")
        srv.proc.send_signal(signal.SIGTERM)
        t_sig = time.monotonic()

        def refused():
            try:
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=1)
            except (ConnectionRefusedError, ConnectionResetError):
                return True      # reset: it raced the listener's close; not accepted
            s.close()
            return False

        wait_until(refused, 3, what="listener to close after SIGTERM")
        t_refused = time.monotonic() - t_sig
        self.assertIsNone(srv.proc.poll(),
                          "process exited before in-flight requests finished")
        closed, _, data = idle.wait_closed(3)
        self.assertTrue(closed, "idle keep-alive connection not closed on SIGTERM")
        self.assertEqual(data, b"", "idle connection got unexpected bytes")
        for i, c in enumerate(conns):
            r = c.read_response()
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.headers.get("connection", "").lower(), "close", r.headers)
            out = output_by_name(r.json(), "output")
            self.assertEqual(flatten(out["data"]), [0.0] * (i + 1))
        try:
            rc = srv.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.fail("server did not exit within 5 s after draining")
        srv.reaped(rc)
        self.assertEqual(rc, 0, f"exit status after drain; stderr:\n{srv.stderr()}")
        self.assertTrue(refused(), "new connections accepted after exit")
        self.assertLess(t_refused, 0.7, "listener closed only after the requests finished")

    def test_drain_timeout_exits_1(self):
        model = write_yaml("stuck.yaml", "service_time: {dist: fixed, mean_ms: 20000}\n"
                                         "cpu_us: 0\nsaturation: 1000\n")
        srv = start_server(self, model, "--runtime", "synthetic", "--drain-timeout-ms", "300")
        base = in_flight(srv.port)   # 1 if the gauge counts the scrape itself, else 0
        c = RawConn(srv.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", f"/v2/models/{srv.name}/infer",
                           oip_body(np.zeros((1, 2), np.float32))))
        wait_until(lambda: in_flight(srv.port) >= 1 + base, 5, what="request in flight")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.fail("server ignored --drain-timeout-ms")
        srv.reaped(rc)
        self.assertEqual(rc, 1, f"stderr:\n{srv.stderr()}")
        self.assertGreaterEqual(time.monotonic() - t0, 0.2)

    def test_sigint_is_graceful(self):
        srv = start_server(self, model_path("binary.json"))
        self.assertJsonOk(req(srv.port, "GET", "/v2/health/live"))
        srv.proc.send_signal(signal.SIGINT)
        rc = srv.proc.wait(timeout=5)
        srv.reaped(rc)
        self.assertEqual(rc, 0, srv.stderr())


# --------------------------------------------------------------------------- synthetic

class Synthetic(ReplicaTestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(cls, model_path("synthetic.yaml"), "--runtime", "synthetic",
                               cls_level=True)

    def test_name_and_listening(self):
        self.assertEqual(self.srv.name, "synthetic")

    def test_infer_answers_zeros(self):
        for rows, feats in ((1, 5), (3, 5), (7, 1)):
            body = oip_body(np.arange(rows * feats, dtype=np.float32).reshape(rows, feats))
            body["id"] = f"s{rows}"
            j = self.assertJsonOk(req(self.srv.port, "POST", "/v2/models/synthetic/infer", body))
            self.assertEqual(j.get("id"), f"s{rows}")
            self.assertEqual([o["name"] for o in j["outputs"]], ["output"], j)
            out = j["outputs"][0]
            self.assertEqual(out["datatype"], "FP32", out)
            self.assertEqual(out["shape"][0], rows, out)
            self.assertEqual(int(np.prod(out["shape"])), rows, out)
            self.assertEqual(flatten(out["data"]), [0.0] * rows, out)

    def test_infer_bad_input_still_400(self):
        self.assertOipError(req(self.srv.port, "POST", "/v2/models/synthetic/infer",
                                 b"{bad"), 400)
        self.assertOipError(req(self.srv.port, "POST", "/v2/models/synthetic/infer",
                                 {"inputs": []}), 400)

    def test_runtime_auto_rejects_yaml(self):
        p = run_to_exit([FLOTILLA_BIN, "replica", "--model", model_path("synthetic.yaml"),
                         "--runtime", "auto", "--port", "0"])
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stderr.strip(), "no message on stderr")
        self.assertNotIn(b'"listening"', p.stdout)


# --------------------------------------------------------------------------- loading

class LoadingReplica:
    """A `flotilla replica` whose model takes a while to load (a synthetic model with
    `load_ms`). It answers on its port before the listening line comes (that line means
    "ready"), so the test picks the port itself."""

    def __init__(self, owner, model, *args):
        self.port = harness.free_port()
        self.argv = [FLOTILLA_BIN, "replica", "--model", model, "--runtime", "synthetic",
                     "--host", "127.0.0.1", "--port", str(self.port), "--workers", "2", *args]
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self.stdout = b""
        owner.addCleanup(self.close)

    def stderr(self):
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-4000:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()

    def get(self, path):
        """The response, or None when nothing answers yet (or the connection broke)."""
        try:
            return req(self.port, "GET", path, timeout=2)
        except OSError:
            return None

    def wait_live(self, test):
        def live():
            if self.proc.poll() is not None:
                test.fail(f"replica exited (rc={self.proc.returncode}) before it answered:\n"
                          f"{self.stderr()}")
            r = self.get("/v2/health/live")
            return r is not None and r.status == 200
        wait_until(live, STARTUP_DEADLINE_S, what="/v2/health/live to answer 200")

    def stdout_ready(self):
        """Whether the replica wrote anything on stdout yet (never blocks)."""
        return bool(select.select([self.proc.stdout], [], [], 0)[0])

    def read_listening(self, deadline_s):
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + deadline_s
        while b"\n" not in self.stdout:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no listening line within {deadline_s}s:\n{self.stderr()}")
            if select.select([fd], [], [], min(left, 0.2))[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise AssertionError(f"replica exited (rc={self.proc.wait()}) before "
                                         f"listening:\n{self.stderr()}")
                self.stdout += chunk
        return json.loads(self.stdout.split(b"\n", 1)[0])


class Loading(ReplicaTestCase):
    """The replica listens while its model loads: live, /metrics and /v2 answer, readiness
    and the model routes answer 503 until the model is served (docs/replica.md)."""

    def synthetic(self, name, load_ms):
        return write_yaml(name, f"load_ms: {load_ms}\nservice_time: {{dist: fixed, mean_ms: 0}}\n")

    def test_answers_while_loading_then_serves(self):
        rep = LoadingReplica(self, self.synthetic("loading-3s.yaml", 3000))
        rep.wait_live(self)
        # Nothing on stdout yet, and (checked after it) still loading: the listening line
        # comes only once the model is served.
        no_line_yet = not rep.stdout_ready()
        r = rep.get("/v2/health/ready")
        self.assertEqual(r.status, 503, r)
        self.assertEqual(r.json(), {"ready": False, "state": "loading"})
        self.assertTrue(no_line_yet, "listening line printed before the model was served")

        r = req(rep.port, "POST", "/invocations", {"instances": [[1.0, 2.0]]})
        self.assertMlflowError(r, 503, "TEMPORARILY_UNAVAILABLE")
        self.assertEqual(r.headers.get("retry-after"), "1", r)
        self.assertIn("loading", r.json()["message"])
        r = req(rep.port, "POST", "/v2/models/loading-3s/infer",
                oip_body(np.zeros((1, 2), np.float32)))
        self.assertOipError(r, 503)
        self.assertEqual(r.headers.get("retry-after"), "1", r)
        self.assertIn("loading", r.json()["error"])
        self.assertEqual(rep.get("/v2/models/loading-3s/ready").status, 503)
        self.assertEqual(rep.get("/ping").status, 503)
        self.assertJsonOk(rep.get("/v2"))
        r = rep.get("/metrics")
        self.assertEqual(r.status, 200, r)
        metrics = parse_metrics(r.body.decode())
        self.assertTrue(any(n.startswith("flotilla_") for n, _ in metrics), metrics)
        self.assertEqual(metrics[("flotilla_replica_model_load_seconds", frozenset())], 0)
        r = rep.get("/v2/health/ready")
        self.assertEqual(r.status, 503, "the model loaded while the test ran: the checks "
                         "above may have raced it; they assume 3 s of loading")

        info = rep.read_listening(30)
        self.assertEqual((info["event"], info["port"], info["model"]),
                         ("listening", rep.port, "loading-3s"), info)
        self.assertJsonOk(rep.get("/v2/health/ready"))
        j = self.assertJsonOk(req(rep.port, "POST", "/v2/models/loading-3s/infer",
                                  oip_body(np.zeros((2, 2), np.float32))))
        self.assertEqual(flatten(output_by_name(j, "output")["data"]), [0.0, 0.0])
        r = req(rep.port, "POST", "/invocations", {"instances": [[1.0, 2.0]]})
        self.assertEqual(r.status, 200, r)
        metrics = parse_metrics(rep.get("/metrics").body.decode())
        self.assertGreaterEqual(metrics[("flotilla_replica_model_load_seconds", frozenset())],
                                3.0)
        rep.proc.send_signal(signal.SIGTERM)
        self.assertEqual(rep.proc.wait(timeout=harness.STOP_DEADLINE_S), 0, rep.stderr())

    def test_signal_while_loading_exits_0_at_once(self):
        # An hour of loading: only a prompt exit, not the end of loading, can pass this.
        model = self.synthetic("loading-1h.yaml", 3600000)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig.name):
                rep = LoadingReplica(self, model)
                rep.wait_live(self)
                rep.proc.send_signal(sig)
                try:
                    rc = rep.proc.wait(timeout=harness.STOP_DEADLINE_S)
                except subprocess.TimeoutExpired:
                    self.fail(f"no exit within {harness.STOP_DEADLINE_S}s of {sig.name} "
                              f"while loading:\n{rep.stderr()}")
                self.assertEqual(rc, 0, rep.stderr())
                self.assertEqual(rep.proc.stdout.read(), b"", "nothing served, nothing printed")

    def test_bad_load_ms_is_a_clear_error(self):
        for i, value in enumerate(("-1", "soon", "[1, 2]", ".nan", "3600001")):
            with self.subTest(load_ms=value):
                model = write_yaml(f"bad-load-{i}.yaml", f"load_ms: {value}\n")
                p = run_to_exit([FLOTILLA_BIN, "replica", "--model", model, "--runtime",
                                 "synthetic", "--host", "127.0.0.1", "--port", "0"])
                err = p.stderr.decode("utf-8", "replace")
                self.assertEqual(p.returncode, 2, err)
                self.assertIn("load_ms", err)
                self.assertIn(f"bad-load-{i}.yaml", err)
                self.assertNotIn(b"listening", p.stdout)


# --------------------------------------------------------------------------- startup

class StartupErrors(ReplicaTestCase):
    def check_fails(self, model, mention, *extra):
        p = run_to_exit([FLOTILLA_BIN, "replica", "--model", model, "--host", "127.0.0.1",
                         "--port", "0", *extra])
        err = p.stderr.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 2, f"exit status; stderr:\n{err}")
        self.assertIn(mention, err, "stderr should name the file")
        self.assertNotIn(b"listening", p.stdout)
        return err

    def test_missing_model_file(self):
        self.check_fails(os.path.join(MODELS_DIR, "does_not_exist.json"), "does_not_exist.json")

    def test_corrupt_model_file(self):
        self.check_fails(model_path("corrupt.json"), "corrupt.json")

    def test_directory_without_mlmodel(self):
        d = os.path.join(_tmp_root, "empty_model_dir")
        os.makedirs(d, exist_ok=True)
        self.check_fails(d, "empty_model_dir")

    def test_mlmodel_pointing_at_missing_data(self):
        d = os.path.join(_tmp_root, "mlflow_no_data")
        os.makedirs(d, exist_ok=True)
        shutil.copy(model_path("mlflow_booster/MLmodel"), os.path.join(d, "MLmodel"))
        self.check_fails(d, "model.xgb")

    def test_empty_model_file(self):
        path = os.path.join(_tmp_root, "empty.json")
        open(path, "w").close()
        self.check_fails(path, "empty.json")

    def test_help(self):
        p = run_to_exit([FLOTILLA_BIN, "replica", "--help"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"--model", p.stdout + p.stderr)


# --------------------------------------------------------------------------- robustness

JSON_FRAGMENTS = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"null", b"true", b"false",
                  b"-", b"0", b"-0", b"1e999", b"-1e-999", b"1.5", b"99999999999999999999",
                  b'"shape"', b'"data"', b'"datatype"', b'"FP32"', b'"INT64"', b'"BOOL"',
                  b'"inputs"', b'"instances"', b'"dataframe_split"', b'"columns"',
                  b"[[", b"]]", b"{}", b"[]", b'"\\u0000"', b'"\\ud800"', b"\x00", b"\xff",
                  b"\xc3\x28", b" " * 50, b"\\", b"/*", b"NaN", b"Infinity", b"[-1]",
                  b"[4294967296, 4294967296]", b"[0, 30]", b"18446744073709551616"]


def mutate(rng, body):
    b = bytearray(body)
    op = rng.randrange(8)
    if op == 0:                                  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif op == 1:                                # truncation
        del b[rng.randrange(len(b)):]
    elif op == 2:                                # insert a fragment
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.choice(JSON_FRAGMENTS)
    elif op == 3:                                # delete a slice
        i = rng.randrange(len(b))
        del b[i:i + rng.randint(1, 40)]
    elif op == 4:                                # duplicate a slice
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.randint(1, 60))
        b[j:j] = b[i:j]
    elif op == 5:                                # replace a number with a fragment
        nums = [m.span() for m in re.finditer(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?", bytes(b))]
        if nums:
            s, e = rng.choice(nums)
            b[s:e] = rng.choice(JSON_FRAGMENTS)
    elif op == 6:                                # random bytes
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:                                        # replace a string token with a fragment
        strs = [m.span() for m in re.finditer(rb'"[^"]*"', bytes(b))]
        if strs:
            s, e = rng.choice(strs)
            b[s:e] = rng.choice(JSON_FRAGMENTS)
    return bytes(b)


class Robustness(ReplicaTestCase):
    N = 300
    SEED = 20240601

    @classmethod
    def setUpClass(cls):
        cls.srv = start_server(cls, model_path("multiclass.ubj"), cls_level=True)

    def test_random_mutations(self):
        ds = dataset("iris")
        X = ds.rows[:3]
        bases = [
            ("/v2/models/multiclass/infer", json.dumps(oip_body(X)).encode(), False),
            ("/v2/models/multiclass/infer", json.dumps(oip_body(X, nested=True)).encode(), False),
            ("/v2/models/multiclass/infer",
             json.dumps(oip_columnar_body(X, IRIS_FEATURES)).encode(), False),
            ("/invocations", json.dumps({"dataframe_split": {
                "columns": IRIS_FEATURES, "data": _jsonable(X)}}).encode(), True),
            ("/invocations", json.dumps({"dataframe_records": [
                dict(zip(IRIS_FEATURES, r)) for r in _jsonable(X)]}).encode(), True),
            ("/invocations", json.dumps({"instances": _jsonable(X)}).encode(), True),
            ("/invocations", json.dumps({"inputs": {
                n: _jsonable(X[:, j]) for j, n in enumerate(IRIS_FEATURES)}}).encode(), True),
        ]
        rng = random.Random(self.SEED)
        conn = None
        statuses = {}
        for i in range(self.N):
            path, base, is_mlflow = bases[i % len(bases)]
            body = base
            for _ in range(rng.choice((1, 1, 2, 3))):
                body = mutate(rng, body) or b"{"
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.srv.port,
                                                  timeout=HTTP_TIMEOUT_S)
            try:
                r = req(0, "POST", path, body, headers={"Content-Type": "application/json"},
                         conn=conn)
            except (http.client.HTTPException, OSError) as e:
                self.fail(f"mutation {i}: no well-formed response ({e!r}) to {path} "
                          f"body={body[:400]!r}\nserver alive={self.srv.alive()}\n"
                          f"stderr:\n{self.srv.stderr()}")
            statuses[r.status] = statuses.get(r.status, 0) + 1
            ctx = f"mutation {i}: {path} body={body[:400]!r} -> {r!r}"
            self.assertTrue(200 <= r.status < 300 or 400 <= r.status < 500, ctx)
            try:
                j = r.json()
            except ValueError:
                self.fail("non-JSON body; " + ctx)
            self.assertIsInstance(j, dict, ctx)
            if r.status >= 400:
                if is_mlflow and r.status in (400, 415):
                    self.assertEqual(j.get("error_code"), "BAD_REQUEST", ctx)
                    self.assertIsInstance(j.get("message"), str, ctx)
                else:
                    self.assertIsInstance(j.get("error"), str, ctx)
            if r.headers.get("connection", "").lower() == "close":
                conn.close()
                conn = None
        if conn is not None:
            conn.close()
        self.assertTrue(self.srv.alive(), f"server died:\n{self.srv.stderr()}")
        self.assertGreater(statuses.get(400, 0), self.N // 3, statuses)
        j = self.assertJsonOk(req(self.srv.port, "POST", "/v2/models/multiclass/infer",
                                   oip_body(X)))
        self.assertClose(np.asarray(flatten(j["outputs"][0]["data"])).reshape(3, 3),
                         booster_predict("multiclass.ubj", X))


if __name__ == "__main__":
    unittest.main(verbosity=2)


# --------------------------------------------------------------------------- review regressions

class ReviewRegressions(ReplicaTestCase):
    """Cases found in review of the first replica change; each once crashed, hung or broke
    the contract."""

    def test_same_output_requested_twice_is_400(self):
        srv = start_server(self, model_path("binary.json"))
        X = dataset("breast_cancer").X32[:1]
        body = oip_body(X)
        body["outputs"] = [{"name": "predict"}, {"name": "predict"}]
        r = req(srv.port, "POST", "/v2/models/binary/infer", body)
        self.assertOipError(r, 400)
        self.assertIn("twice", r.json()["error"])
        self.assertEqual(req(srv.port, "POST", "/v2/models/binary/infer", oip_body(X)).status, 200)

    def test_huge_declared_shapes_are_rejected_without_allocating(self):
        srv = start_server(self, model_path("binary.json"))
        for shape, datatype in (([2147483648, 0], "FP32"), ([2147483647], "FP64"),
                                ([0, 2147483647], "FP32")):
            body = {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": []}]}
            r = req(srv.port, "POST", "/v2/models/binary/infer", body)
            self.assertOipError(r, 400)
        self.assertTrue(srv.alive())

    def test_csv_with_missing_columns_is_rejected_before_allocating(self):
        srv = start_server(self, model_path("multiclass.ubj"))
        body = "sepal_length\n" + "1.0\n" * 200000
        r = req(srv.port, "POST", "/invocations", body, {"Content-Type": "text/csv"})
        self.assertMlflowError(r, 400)
        self.assertIn("missing input for feature", r.json()["message"])

    def test_port_in_use_is_an_error(self):
        first = start_server(self, model_path("binary.json"))
        proc = subprocess.run([FLOTILLA_BIN, "replica", "--model", model_path("binary.json"),
                               "--port", str(first.port)],
                              capture_output=True, text=True, timeout=STARTUP_DEADLINE_S)
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertIn("cannot listen", proc.stderr)

    def test_head_gets_no_body(self):
        srv = start_server(self, model_path("binary.json"))
        conn = RawConn(srv.port)
        self.addCleanup(conn.close)
        conn.send(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        status_line = conn._read_until(b"\r\n\r\n")
        self.assertIn(b"405", status_line.split(b"\r\n")[0])
        self.assertIn(b"content-length: 0", status_line.lower())
        r = conn.read_response()  # the next response starts right after the HEAD headers
        self.assertEqual(r.status, 200, r)

    def test_pipelined_requests_are_answered_during_drain(self):
        model = write_yaml("pipeline-drain.yaml", "service_time: {dist: fixed, mean_ms: 400}\n")
        srv = start_server(self, model, "--runtime", "synthetic")
        body = oip_body(np.zeros((1, 3), np.float32))
        conn = RawConn(srv.port)
        self.addCleanup(conn.close)
        path = f"/v2/models/{srv.name}/infer"
        conn.send(raw_request("POST", path, body) + raw_request("POST", path, body))
        wait_until(lambda: in_flight(srv.port) >= 1, 5, what="first request in flight")
        srv.proc.send_signal(signal.SIGTERM)
        first, second = conn.read_response(), conn.read_response()
        self.assertEqual((first.status, second.status), (200, 200))
        self.assertEqual(second.headers.get("connection", "").lower(), "close")
        srv.reaped(srv.proc.wait(timeout=10))
        self.assertEqual(srv.proc.returncode, 0)

    def test_http10_keep_alive_is_confirmed(self):
        srv = start_server(self, model_path("binary.json"))
        conn = RawConn(srv.port)
        self.addCleanup(conn.close)
        conn.send(b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        r = conn.read_response()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers.get("connection", "").lower(), "keep-alive")

    def test_listening_line_is_json_for_any_name(self):
        srv = start_server(self, model_path("binary.json"), "--name", 'odd "name"\\x')
        self.assertEqual(srv.name, 'odd "name"\\x')


# --------------------------------------------------------------------------- model versions

class ModelVersions(ReplicaTestCase):
    """Issue 18: /v2/models/{m}/versions/{v}/... serves only the version the replica was
    started with (--model-version, default 1); any other is an OIP 404 naming it."""

    def test_version_paths_name_the_served_version(self):
        srv = start_server(self, model_path("binary.json"), "--model-version", "v2")
        X = dataset("breast_cancer").X32[:2]
        meta = self.assertJsonOk(req(srv.port, "GET", "/v2/models/binary"))
        self.assertEqual(meta["versions"], ["v2"])
        self.assertEqual(self.assertJsonOk(req(srv.port, "GET", "/v2/models/binary/versions/v2")),
                         meta)
        for path in ("/v2/models/binary/infer", "/v2/models/binary/versions/v2/infer"):
            j = self.assertJsonOk(req(srv.port, "POST", path, oip_body(X)))
            self.assertEqual((j["model_name"], j["model_version"]), ("binary", "v2"), path)
        for method, path in (("GET", "/v2/models/binary/versions/1"),
                             ("GET", "/v2/models/binary/versions/1/ready"),
                             ("POST", "/v2/models/binary/versions/1/infer")):
            r = req(srv.port, method, path, oip_body(X) if method == "POST" else None)
            self.assertOipError(r, 404)
            self.assertIn("version '1' of model 'binary'", r.json()["error"])

    def test_unversioned_replica_serves_version_1_only(self):
        srv = start_server(self, model_path("binary.json"))
        X = dataset("breast_cancer").X32[:1]
        self.assertEqual(self.assertJsonOk(req(srv.port, "GET", "/v2/models/binary"))["versions"],
                         ["1"])
        r = req(srv.port, "POST", "/v2/models/binary/versions/9/infer", oip_body(X))
        self.assertOipError(r, 404)
        self.assertIn("'9'", r.json()["error"])
        j = self.assertJsonOk(req(srv.port, "POST", "/v2/models/binary/versions/1/infer",
                                  oip_body(X)))
        self.assertEqual(j["model_version"], "1")

    def test_a_version_that_cannot_be_a_path_segment_is_refused(self):
        self.assertRefused("--model-version", "a/b")


class LogLines(ReplicaTestCase):
    """Issue 23, item 5: a replica's log is one JSON object a line on stderr (time, level,
    component, endpoint, replica, message); --log-format text is for a person."""

    TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")

    def test_json_lines_name_the_endpoint_and_replica(self):
        srv = start_server(self, model_path("binary.json"), "--name", "fraud",
                           "--replica-id", "fraud-1-abc")
        self.assertEqual(srv.stop(), 0)
        lines = [line for line in srv.stderr().splitlines() if line.strip()]
        self.assertGreaterEqual(len(lines), 2, srv.stderr())
        for line in lines:
            entry = json.loads(line)
            self.assertEqual(list(entry), ["time", "level", "component", "endpoint", "replica",
                                           "message"], line)
            self.assertRegex(entry["time"], self.TIME)
            self.assertEqual((entry["component"], entry["endpoint"], entry["replica"]),
                             ("replica", "fraud", "fraud-1-abc"), line)
        messages = [json.loads(line)["message"] for line in lines]
        self.assertTrue(any(m.startswith("serving model 'fraud'") for m in messages), messages)
        self.assertIn("drained, exiting", messages)

    def test_text_lines_on_request(self):
        srv = start_server(self, model_path("binary.json"), "--log-format", "text")
        self.assertEqual(srv.stop(), 0)
        lines = [line for line in srv.stderr().splitlines() if line.strip()]
        self.assertTrue(lines, srv.stderr())
        for line in lines:
            self.assertFalse(line.startswith("{"), line)
            self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} ")
        self.assertTrue(any("drained, exiting" in line for line in lines), lines)

    def test_an_unknown_format_is_refused(self):
        self.assertRefused("--log-format", "xml")
