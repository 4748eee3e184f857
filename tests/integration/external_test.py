#!/usr/bin/python3
"""The external runtime through `flotilla up` (issue 24 item 1; docs/external-runtime.md): a
user's own model server, in another language than Flotilla's, started, probed, routed to,
replaced and stopped by the platform as its own replicas are, behind the gateway's auth,
balancer and retries.

  ExternalOip  oip_server.py (Python's standard library, OIP v2 over HTTP) as the server
  MlServer     Seldon's MLServer from the Python package index, serving a scikit-learn model
               (a venv made by mlserver_venv.sh; skipped when the index cannot be reached)
  MlflowFlavors  `runtime: auto` on MLflow sklearn and pyfunc models: MLflow's own scoring
               server from flotilla up's PATH (mlflow_venv.sh; skipped likewise)
  MlflowDeployments  MLflow's deployments client (Databricks-style serving endpoints) on the
               gateway and the control plane's API (mlflow_venv.sh; skipped likewise)
  TritonClientHttp  tritonclient[http] on an xgboost and an external endpoint
               (clients_venv.sh; skipped likewise)
  TritonClientGrpc  tritonclient[grpc] likewise, through the gateway's gRPC port and straight
               to a replica's (`flotilla replica --grpc-port`)

Run from the repository root:

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v tests/integration/external_test.py
"""
import json
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import control_test  # noqa: E402  (its `flotilla up` driver, fixtures and teardown)
import harness  # noqa: E402
from control_test import BIN, ControlTestCase, TRACKER, spec  # noqa: E402
from harness import wait_until  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OIP_SERVER = os.path.join(HERE, "oip_server.py")
MLSERVER_VENV_SCRIPT = os.path.join(HERE, "mlserver_venv.sh")
ROWS = [[1.0, 2.0, 3.0, 4.0], [0.5, 0.25, 0.125, 0.0625]]


def setUpModule():
    control_test.setUpModule()


def tearDownModule():
    control_test.tearDownModule()


def oip_rows(rows, name="x", datatype="FP32"):
    return {"inputs": [{"name": name, "shape": [len(rows), len(rows[0])], "datatype": datatype,
                        "data": [x for row in rows for x in row]}]}


def output(body, name):
    return next(o for o in body["outputs"] if o["name"] == name)


def external_server(name, model_dir, replicas=2, extra=()):
    """A served model running oip_server.py, `replicas` of it (one request in flight each)."""
    return {"name": name, "model": model_dir, "runtime": "external",
            "external": {"command": ["/usr/bin/python3", OIP_SERVER, "--port", "{port}",
                                     "--name", "{endpoint}", *extra],
                         "ready_path": "/v2/health/ready"},
            "concurrency": {"min": replicas, "max": 4 * replicas},
            "per_replica_concurrency": {"min": 1, "max": 4, "initial": 1}}


class ExternalTestCase(ControlTestCase):
    def serve_iris_and_sums(self, token_id):
        """Deploys the xgboost iris classifier and an oip_server.py "sums", waits until both
        serve, and returns a new token's secret."""
        self.up.create(spec("iris", {"name": "v1", "model": control_test.model_path(
            control_test.PROBA)}))
        self.up.create(spec("sums", external_server("v1", control_test.fresh_dir("m"), 1)))
        self.up.wait_serving("iris")
        self.up.wait_serving("sums")
        self.live_servers("sums")
        return self.up.api("POST", "/api/2.0/tokens", {"id": token_id}).json()["token"]

    def assert_same_probabilities(self, probabilities, rest):
        """A client's `predict` output ([rows, classes], as_numpy) equals the gateway's REST
        answer for the two rows (setosa, versicolor)."""
        flat = [p for row in probabilities for p in row]
        self.assertEqual(len(flat), len(output(rest, "predict")["data"]))
        for a, b in zip(flat, output(rest, "predict")["data"]):
            self.assertAlmostEqual(a, b, places=6)
        self.assertEqual([max(range(3), key=row.__getitem__) for row in probabilities], [0, 1])

    def live_servers(self, name):
        """The ready replicas of `name` (each one remembered for teardown)."""
        view = self.up.view(name)
        ready = [r for r in view["replicas"] if r["state"] == "ready"]
        for replica in ready:
            TRACKER.record(replica["pid"])
        return ready


class ExternalOip(ExternalTestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up("--no-autoscale", "--warm-pool", "0")
        cls.model_dir = control_test.fresh_dir("oip-model")

    def deploy(self, name, replicas=2):
        self.up.create(spec(name, external_server("v1", self.model_dir, replicas)))
        self.up.wait_serving(name)
        return self.live_servers(name)

    def test_serves_through_the_gateway_with_auth_and_spreads_over_replicas(self):
        servers = self.deploy("sums")
        self.assertEqual(len(servers), 2)
        self.assertTrue(all(r["from_warm_pool"] is False for r in servers))
        pids = set()
        for _ in range(40):
            r = self.up.gw("POST", "/v2/models/sums/infer", oip_rows(ROWS))
            self.assertEqual(r.status, 200, r)
            body = r.json()
            self.assertEqual(output(body, "sum")["data"], [10.0, 0.9375])
            pids.add(output(body, "pid")["data"][0])
        self.assertEqual(pids, {r["pid"] for r in servers}, "both replicas serve")
        # The versioned path, the model's metadata and readiness, as the server answers them.
        r = self.up.gw("POST", "/v2/models/sums/versions/v1/infer", oip_rows(ROWS))
        self.assertEqual(r.status, 200, r)
        r = self.up.gw("GET", "/v2/models/sums")
        self.assertEqual((r.status, r.json()["platform"]), (200, "python-oip-test"), r)
        self.assertEqual(self.up.gw("GET", "/v2/models/sums/ready").status, 200)

        # The gateway's auth holds for it as for any endpoint.
        self.assertEqual(self.up.gw("POST", "/v2/models/sums/infer", oip_rows(ROWS),
                                    token=None).status, 401)
        self.assertEqual(self.up.gw("POST", "/v2/models/sums/infer", oip_rows(ROWS),
                                    token="flt_nobody_" + "0" * 64).status, 401)
        # The server's own errors reach the client as it sent them.
        r = self.up.gw("POST", "/v2/models/sums/infer",
                       {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                    "data": [1.0]}]})
        self.assertEqual(r.status, 400, r)
        self.assertIn("shape [2, 3] does not fit 1 values", r.json()["error"])
        r = self.up.gw("POST", "/v2/models/sums/infer", oip_rows(ROWS, datatype="BYTES"))
        self.assertEqual(r.status, 400, r)
        self.assertIn("datatype BYTES", r.json()["error"])

        # Its log lines land in the replica's log file under the data directory.
        log = os.path.join(self.up.data_dir, "logs", servers[0]["id"] + ".log")
        with open(log) as f:
            self.assertIn("oip_server: serving model sums on port " +
                          servers[0]["address"].rsplit(":", 1)[1], f.read())

    def test_a_killed_server_is_replaced_and_requests_keep_succeeding(self):
        servers = self.deploy("crashy")
        victim = servers[0]
        os.kill(victim["pid"], signal.SIGKILL)
        # Requests meanwhile go to the other one (or are retried there).
        for _ in range(20):
            r = self.up.gw("POST", "/v2/models/crashy/infer", oip_rows(ROWS))
            self.assertEqual(r.status, 200, r)
        view = self.up.wait_view(
            "crashy", lambda v: sum(r["state"] == "ready" and r["id"] != victim["id"]
                                    for r in v["replicas"]) == 2,
            "a replacement ready")
        failed = [r for r in view["replicas"] if r["id"] == victim["id"]]
        self.assertEqual(failed[0]["state"], "failed")
        self.assertIn("killed by signal 9", failed[0]["reason"])
        self.assertTrue(any(e["kind"] == "replica_failed" for e in self.up.events("crashy")))

    def test_deleting_the_endpoint_stops_its_servers(self):
        servers = self.deploy("gone", replicas=1)
        pid, ticks = servers[0]["pid"], harness.process_start_ticks(servers[0]["pid"])
        self.up.delete("gone")
        wait_until(lambda: harness.process_start_ticks(pid) != ticks,
                   control_test.GONE_DEADLINE_S, what="the server stopped")

    def test_a_server_that_answers_but_is_not_ready_is_loading_and_not_routed_to(self):
        self.up.create(spec("never", external_server("v1", self.model_dir, 1,
                                                     extra=["--fail-ready"])))
        view = self.up.wait_view(
            "never", lambda v: any(r["state"] == "loading" for r in v["replicas"]),
            "the server answers, not ready")
        TRACKER.record(view["replicas"][0]["pid"])
        self.assertEqual(view["state"]["ready"], "NOT_READY")
        # The gateway's table has no replica for it: requests wait for one (the cold-start
        # hold) and reach no server.
        stats = self.up.gw("GET", "/gateway/stats").json()
        self.assertEqual([e["replicas"] for e in stats["endpoints"] if e["name"] == "never"],
                         [[]])
        self.up.delete("never")

    def test_bad_external_specs_are_refused_naming_the_field(self):
        def refused(served, field):
            r = self.up.api("POST", "/api/2.0/serving-endpoints", spec("bad", served))
            self.assertApiError(r, 400, "INVALID_PARAMETER_VALUE", field)
            self.assertEqual(self.up.api("GET", "/api/2.0/serving-endpoints/bad").status, 404)

        missing = external_server("v1", self.model_dir)
        missing["external"]["command"][0] = "no-such-model-server"
        refused(missing, "served_models[0].external.command[0]: 'no-such-model-server' is not "
                         "an executable on PATH")
        nowhere = external_server("v1", self.model_dir)
        nowhere["external"]["workdir"] = os.path.join(self.model_dir, "nowhere")
        refused(nowhere, "served_models[0].external.workdir")
        no_command = external_server("v1", self.model_dir)
        del no_command["external"]
        refused(no_command, "served_models[0].external: is required with runtime: external")
        shell_string = external_server("v1", self.model_dir)
        shell_string["external"]["command"] = "python3 server.py --port $PORT"
        refused(shell_string, "served_models[0].external.command: must be a list")
        port = external_server("v1", self.model_dir)
        port["external"]["env"] = {"PORT": "80"}
        refused(port, "served_models[0].external.env.PORT")
        # An MLflow model of a flavor served through MLflow's scoring server, with no `mlflow`
        # on this flotilla up's PATH: what to install.
        mlflow_model = control_test.fresh_dir("mlflow-sklearn")
        with open(os.path.join(mlflow_model, "MLmodel"), "w") as f:
            f.write("flavors:\n  python_function: {loader_module: mlflow.sklearn}\n"
                    "  sklearn: {pickled_model: model.pkl}\n")
        refused({"name": "v1", "model": mlflow_model},
                "is an MLflow model of flavors [python_function, sklearn], which Flotilla "
                "serves through MLflow's own scoring server, and `mlflow` is not on flotilla "
                "up's PATH: install MLflow")


class _SkipClass:
    """What venv_python needs of a test to skip it, for a setUpClass."""

    def skipTest(self, reason):  # noqa: N802  (unittest's name)
        raise unittest.SkipTest(reason)


TRAIN_IRIS = """
import json, sys, joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
X, y = load_iris(return_X_y=True)
model = LogisticRegression(max_iter=1000).fit(X, y)
joblib.dump(model, sys.argv[1] + "/model.joblib")
json.dump({"rows": X.tolist(), "predictions": model.predict(X).tolist()},
          open(sys.argv[1] + "/expected.json", "w"))
"""


class MlServer(ExternalTestCase):
    """Seldon's MLServer (PyPI, pinned) as the external runtime's server, serving a
    scikit-learn model: MLServer's own settings variables carry the ports Flotilla picks."""

    @classmethod
    def setUpClass(cls):
        python = harness.venv_python(_SkipClass(), "mlserver_venv.sh", "mlserver-venv",
                                     "MLServer")
        cls.mlserver = os.path.join(os.path.dirname(python), "mlserver")
        cls.model_dir = control_test.fresh_dir("sklearn-iris")
        subprocess.run([python, "-c", TRAIN_IRIS, cls.model_dir], check=True, timeout=120)
        with open(os.path.join(cls.model_dir, "expected.json")) as f:
            cls.expected = json.load(f)
        cls.up = cls.start_up("--no-autoscale", "--warm-pool", "0")

    def served(self):
        return {"name": "v1", "model": self.model_dir, "runtime": "external",
                "external": {
                    "command": [self.mlserver, "start", "{model}"],
                    "env": {"MLSERVER_HOST": "127.0.0.1", "MLSERVER_HTTP_PORT": "{port}",
                            "MLSERVER_GRPC_PORT": "{port:grpc}",
                            "MLSERVER_METRICS_PORT": "{port:metrics}",
                            "MLSERVER_MODEL_NAME": "{endpoint}",
                            "MLSERVER_MODEL_IMPLEMENTATION": "mlserver_sklearn.SKLearnModel",
                            "MLSERVER_MODEL_URI": "{model}/model.joblib"},
                    # MLServer answers /v2/health/ready before its model has loaded.
                    "ready_path": "/v2/models/{endpoint}/ready"},
                "concurrency": {"min": 2, "max": 8},
                "per_replica_concurrency": {"min": 1, "max": 4, "initial": 1}}

    def test_predictions_through_the_gateway_equal_the_models_own(self):
        self.up.create(spec("iris-sk", self.served()))
        self.up.wait_serving("iris-sk", deadline_s=120)
        servers = self.live_servers("iris-sk")
        self.assertEqual(len(servers), 2)
        rows = self.expected["rows"]
        predictions = []
        for start in range(0, len(rows), 25):
            chunk = rows[start:start + 25]
            r = self.up.gw("POST", "/v2/models/iris-sk/infer", oip_rows(chunk, datatype="FP64"))
            self.assertEqual(r.status, 200, r.body.decode(errors="replace"))
            self.assertEqual(r.json()["model_name"], "iris-sk")
            predictions += output(r.json(), "predict")["data"]
        self.assertEqual(predictions, self.expected["predictions"])
        self.assertEqual(len(set(predictions)), 3)

        # MLServer's own error for a wrong shape reaches the client as MLServer sent it (a
        # 500 naming the model's complaint), once: the gateway retries no answered request.
        r = self.up.gw("POST", "/v2/models/iris-sk/infer",
                       {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64",
                                    "data": [1.0, 2.0, 3.0]}]})
        self.assertEqual((r.status, r.headers.get("server")), (500, "uvicorn"), r)
        self.assertIn("X has 3 features, but LogisticRegression is expecting 4", r.json()["error"])

        # Deleted: each server and the inference workers it started are stopped.
        processes = {}
        for server in servers:
            for pid in [server["pid"], *harness.children_of(server["pid"])]:
                TRACKER.record(pid)
                processes[pid] = harness.process_start_ticks(pid)
        self.assertGreater(len(processes), 2, "MLServer runs worker processes")
        self.up.delete("iris-sk")
        wait_until(lambda: all(harness.process_start_ticks(pid) != ticks
                               for pid, ticks in processes.items()),
                   control_test.GONE_DEADLINE_S, what="every MLServer process stopped")


MAKE_MLFLOW_MODELS = """
import json, sys, warnings
warnings.simplefilter("ignore")  # MLflow's advice on type hints, printed at save
import mlflow.pyfunc, mlflow.sklearn
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

class ScaledSum(mlflow.pyfunc.PythonModel):
    # A team's own pyfunc: each row's sum times a factor set when it loads.
    def load_context(self, context):
        self.factor = 2.5
    def predict(self, context, model_input, params=None):
        return (model_input.sum(axis=1) * self.factor).tolist()

out = sys.argv[1]
X, y = load_iris(return_X_y=True)
mlflow.sklearn.save_model(LogisticRegression(max_iter=1000).fit(X, y), out + "/sklearn")
mlflow.pyfunc.save_model(out + "/pyfunc", python_model=ScaledSum())
expected = {}
for flavor in ("sklearn", "pyfunc"):
    predictions = mlflow.pyfunc.load_model(out + "/" + flavor).predict(X[::5])
    expected[flavor] = [p.item() if hasattr(p, "item") else p for p in predictions]
json.dump({"rows": X[::5].tolist(), "expected": expected}, open(out + "/expected.json", "w"))
"""


class MlflowFlavors(ExternalTestCase):
    """`runtime: auto` on MLflow models Flotilla does not serve natively (sklearn, a custom
    pyfunc): served by MLflow's own scoring server, found on flotilla up's PATH (issue 24
    item 2)."""

    @classmethod
    def setUpClass(cls):
        python = harness.venv_python(_SkipClass(), "mlflow_venv.sh", "mlflow-venv", "MLflow")
        cls.models = control_test.fresh_dir("mlflow-models")
        # In the models' directory: MLflow makes its ./mlruns store where it runs.
        subprocess.run([python, "-c", MAKE_MLFLOW_MODELS, cls.models], check=True, timeout=180,
                       cwd=cls.models)
        with open(os.path.join(cls.models, "expected.json")) as f:
            cls.expected = json.load(f)
        bin_dir = os.path.dirname(python)
        old_path = os.environ["PATH"]
        os.environ["PATH"] = bin_dir + os.pathsep + old_path
        try:
            cls.up = cls.start_up("--no-autoscale", "--warm-pool", "0")
        finally:
            os.environ["PATH"] = old_path
        cls.mlflow = os.path.join(bin_dir, "mlflow")

    def test_each_flavor_predicts_through_the_gateway_as_mlflow_loads_it(self):
        for flavor in ("sklearn", "pyfunc"):
            with self.subTest(flavor=flavor):
                name = "mlflow-" + flavor
                model = os.path.join(self.models, flavor)
                view = self.up.create(spec(name, {"name": "v1", "model": model}))
                served = view["pending_config"]["served_models"][0]
                self.assertEqual(served["runtime"], "external")
                self.assertEqual(served["external"]["command"][:4],
                                 [self.mlflow, "models", "serve", "-m"])
                self.up.wait_serving(name, deadline_s=120)
                self.live_servers(name)
                r = self.up.gw("POST", f"/serving-endpoints/{name}/invocations",
                               {"instances": self.expected["rows"]})
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.json()["predictions"], self.expected["expected"][flavor])
        # A row the sklearn model cannot take: MLflow's own error, in MLflow's shape.
        r = self.up.gw("POST", "/serving-endpoints/mlflow-sklearn/invocations",
                       {"instances": [[1.0, 2.0]]})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.json()["error_code"], "BAD_REQUEST")
        self.assertIn("expecting 4 features", r.json()["stack_trace"])


# Run by the MLflow venv's python: MLflow's deployments client for Databricks-style serving
# endpoints, as an MLflow user calls one, pointed at the gateway for predictions and at the
# control plane's API for the endpoint's description. Prints what its own objects say, as JSON.
MLFLOW_DEPLOYMENTS_PROBE = """
import json, os, sys
import requests
from mlflow.deployments import get_deploy_client

gateway, api, token, endpoint = sys.argv[1:5]
os.environ["DATABRICKS_TOKEN"] = token
out = {}

def error(call):
    # The client raises requests' HTTPError, carrying the answer, for an error status.
    try:
        call()
        return None
    except requests.HTTPError as e:
        return {"status": e.response.status_code,
                "error_code": e.response.json()["error_code"]}

os.environ["DATABRICKS_HOST"] = gateway
client = get_deploy_client("databricks")
rows = {"dataframe_split": {"data": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]]}}
response = client.predict(endpoint=endpoint, inputs=rows)
out["type"] = type(response).__name__
out["predictions"] = response["predictions"]
out["bad_input"] = error(lambda: client.predict(endpoint=endpoint, inputs={"nope": 1}))
out["unknown"] = error(lambda: client.predict(endpoint="nope", inputs=rows))
os.environ["DATABRICKS_HOST"] = api
described = client.get_endpoint(endpoint=endpoint)
out["described"] = {"type": type(described).__name__, "name": described["name"]}
out["listed"] = sorted(e["name"] for e in client.list_endpoints())
print(json.dumps(out))
"""


# Run by the clients venv's python: tritonclient.http against the gateway, as a Triton or KServe
# user calls it. Prints what the client's own objects say, as JSON.
TRITON_HTTP_PROBE = """
import json, sys
import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

port, token, models = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
client = httpclient.InferenceServerClient(url="127.0.0.1:" + port)
# A fresh dict per call: infer() adds Inference-Header-Content-Length to the dict it is given,
# which would then go out with the next request too.
def auth():
    return {"Authorization": "Bearer " + token}
rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]], dtype=np.float32)
out = {"live": client.is_server_live(headers=auth()), "ready": client.is_server_ready(headers=auth())}

def error(call):
    try:
        call()
        return None
    except InferenceServerException as e:
        return {"status": e.status(), "message": e.message()}

for model in models:
    # Binary tensor data, the client's default, where the server decodes it (Flotilla's
    # replicas); oip_server.py takes JSON tensors only.
    binary = model == "iris"
    tensor = httpclient.InferInput("x", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    result = client.infer(model, [tensor], headers=auth())
    response = result.get_response()
    out[model] = {
        "model_ready": client.is_model_ready(model, headers=auth()),
        "metadata_name": client.get_model_metadata(model, headers=auth())["name"],
        "outputs": {o["name"]: result.as_numpy(o["name"]).tolist() for o in response["outputs"]},
        "model_name": response["model_name"],
    }
    short = httpclient.InferInput("x", [1, 3], "FP32")
    short.set_data_from_numpy(rows[:1, :3].copy(), binary_data=binary)
    out[model]["wrong_shape"] = error(lambda: client.infer(model, [short], headers=auth()))
    out[model]["no_token"] = error(lambda: client.infer(model, [tensor]))
    as_json = httpclient.InferInput("x", list(rows.shape), "FP32")
    as_json.set_data_from_numpy(rows, binary_data=False)
    out[model]["json_tensors"] = client.infer(model, [as_json], headers=auth()).get_response()
out["unknown_model"] = error(lambda: client.infer("nope", [tensor], headers=auth()))
print(json.dumps(out))
"""


class MlflowDeployments(ExternalTestCase):
    """MLflow's deployments client (`get_deploy_client("databricks")`, the MLflow venv) on
    Flotilla as on Databricks Model Serving: predict through the gateway, describe and list
    through the control plane's API (issue 24 item 4)."""

    @classmethod
    def setUpClass(cls):
        cls.python = harness.venv_python(_SkipClass(), "mlflow_venv.sh", "mlflow-venv", "MLflow")
        cls.up = cls.start_up("--no-autoscale", "--warm-pool", "0")

    def test_predict_describe_and_errors(self):
        self.up.create(spec("iris", {"name": "v1", "model": control_test.model_path(
            control_test.PROBA)}))
        self.up.wait_serving("iris")
        token = self.up.api("POST", "/api/2.0/tokens", {"id": "mlflow", "admin": True}).json()
        p = subprocess.run([self.python, "-c", MLFLOW_DEPLOYMENTS_PROBE,
                            f"http://127.0.0.1:{self.up.gateway_port}",
                            f"http://127.0.0.1:{self.up.api_port}", token["token"], "iris"],
                           capture_output=True, timeout=120,
                           cwd=control_test.fresh_dir("mlflow-deployments"))
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        got = json.loads(p.stdout)
        rest = self.up.invoke("iris", rows=([5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4])).json()
        self.assertEqual(got["type"], "DatabricksEndpoint", got)
        self.assertEqual(got["predictions"], rest["predictions"])
        self.assertEqual(got["bad_input"], {"status": 400, "error_code": "BAD_REQUEST"}, got)
        self.assertEqual(got["unknown"],
                         {"status": 404, "error_code": "RESOURCE_DOES_NOT_EXIST"}, got)
        self.assertEqual(got["described"], {"type": "DatabricksEndpoint", "name": "iris"}, got)
        self.assertEqual(got["listed"], ["iris"], got)


class TritonClientHttp(ExternalTestCase):
    """tritonclient[http] (pinned, clients_venv.sh) through the gateway with auth, on an
    xgboost endpoint and on an external server's: its own result objects and exceptions
    (issue 24 item 4)."""

    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up("--no-autoscale", "--warm-pool", "0")

    def test_infer_metadata_readiness_and_errors(self):
        python = harness.clients_python(self)
        token = self.serve_iris_and_sums("triton")
        p = subprocess.run([python, "-c", TRITON_HTTP_PROBE, str(self.up.gateway_port), token,
                            "iris,sums"], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        got = json.loads(p.stdout)
        self.assertTrue(got["live"] and got["ready"], got)
        # The xgboost endpoint: class probabilities equal the gateway's REST answer.
        rest = self.up.gw("POST", "/v2/models/iris/infer",
                          oip_rows([[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]])).json()
        iris = got["iris"]
        self.assertTrue(iris["model_ready"], got)
        self.assertEqual((iris["metadata_name"], iris["model_name"]), ("iris", "iris"), got)
        self.assert_same_probabilities(iris["outputs"]["predict"], rest)
        self.assertEqual(iris["wrong_shape"]["status"], "400", got)
        # JSON tensors give the same answer as the client's default binary ones.
        self.assertEqual(output(iris["json_tensors"], "predict")["data"],
                         output(rest, "predict")["data"])
        self.assertEqual(iris["no_token"]["status"], "401", got)
        # The external server's.
        sums = got["sums"]
        self.assertTrue(sums["model_ready"], got)
        for a, b in zip(sums["outputs"]["sum"], [10.2, 15.6], strict=True):
            self.assertAlmostEqual(a, b, places=5)
        self.assertEqual(sums["wrong_shape"], None, "3 columns are a valid input for sums")
        self.assertEqual(sums["no_token"]["status"], "401", got)
        self.assertEqual(got["unknown_model"]["status"], "404", got)


# Run by the clients venv's python: tritonclient.grpc against a gRPC port, as a Triton or KServe
# user calls it. Prints what the client's own objects say, as JSON; each error as its gRPC
# status code name and message.
TRITON_GRPC_PROBE = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

port, token, models = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
client = grpcclient.InferenceServerClient(url="127.0.0.1:" + port)
auth = {"authorization": "Bearer " + token} if token else {}
rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]], dtype=np.float32)
out = {"live": client.is_server_live(headers=auth), "ready": client.is_server_ready(headers=auth)}

def error(call):
    try:
        call()
        return None
    except InferenceServerException as e:
        return {"status": e.status(), "message": e.message()}

def tensor(array, datatype="FP32"):
    t = grpcclient.InferInput("x", list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t

for model in models:
    result = client.infer(model, [tensor(rows)], headers=auth, request_id="probe-1")
    response = result.get_response()
    metadata = client.get_model_metadata(model, headers=auth)
    out[model] = {
        "model_ready": client.is_model_ready(model, headers=auth),
        "metadata": {"name": metadata.name, "platform": metadata.platform,
                     "inputs": [i.name for i in metadata.inputs]},
        "outputs": {o.name: result.as_numpy(o.name).tolist() for o in response.outputs},
        "model_name": response.model_name,
        "id": response.id,
        "wrong_shape": error(lambda: client.infer(model, [tensor(rows[:1, :3].copy())],
                                                  headers=auth)),
        "wrong_datatype": error(lambda: client.infer(
            model, [tensor(np.array([[b"a", b"b"]], dtype=np.object_), "BYTES")],
            headers=auth)),
        "no_token": error(lambda: client.infer(model, [tensor(rows)])),
        "bad_token": error(lambda: client.infer(
            model, [tensor(rows)], headers={"authorization": "Bearer flt_nobody_" + "0" * 64})),
    }
out["unknown_model"] = error(lambda: client.infer("nope", [tensor(rows)], headers=auth))
print(json.dumps(out))
"""


class TritonClientGrpc(ExternalTestCase):
    """tritonclient[grpc] (pinned, clients_venv.sh) through the gateway's gRPC port with auth,
    on an xgboost endpoint and an external server's, and straight to a replica's gRPC port: its
    own result objects and status codes (issue 24 items 3 and 4)."""

    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up("--no-autoscale", "--warm-pool", "0")

    def probe(self, python, port, token, models):
        p = subprocess.run([python, "-c", TRITON_GRPC_PROBE, str(port), token, models],
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        return json.loads(p.stdout)

    def assert_iris(self, got, rest):
        iris = got["iris"]
        self.assertTrue(iris["model_ready"], got)
        self.assertEqual(iris["model_name"], "iris", got)
        self.assertEqual(iris["id"], "probe-1", got)
        self.assertEqual((iris["metadata"]["name"], iris["metadata"]["platform"]),
                         ("iris", "xgboost"), got)
        self.assert_same_probabilities(iris["outputs"]["predict"], rest)
        self.assertEqual(iris["wrong_shape"]["status"], "StatusCode.INVALID_ARGUMENT", got)
        self.assertIn("4 features", iris["wrong_shape"]["message"])
        self.assertEqual(iris["wrong_datatype"]["status"], "StatusCode.INVALID_ARGUMENT", got)

    def test_through_the_gateway_with_auth(self):
        python = harness.clients_python(self)
        token = self.serve_iris_and_sums("triton-grpc")
        got = self.probe(python, self.up.grpc_port, token, "iris,sums")
        self.assertTrue(got["live"] and got["ready"], got)
        rest = self.up.gw("POST", "/v2/models/iris/infer",
                          oip_rows([[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]])).json()
        self.assert_iris(got, rest)
        for model in ("iris", "sums"):
            self.assertEqual(got[model]["no_token"],
                             {"status": "StatusCode.UNAUTHENTICATED",
                              "message": "missing bearer token"}, got)
            self.assertEqual(got[model]["bad_token"]["status"], "StatusCode.UNAUTHENTICATED", got)
        # The external server's answers, translated from its JSON.
        sums = got["sums"]
        self.assertTrue(sums["model_ready"], got)
        self.assertEqual(sums["metadata"]["platform"], "python-oip-test", got)
        for a, b in zip(sums["outputs"]["sum"], [10.2, 15.6], strict=True):
            self.assertAlmostEqual(a, b, places=5)
        self.assertEqual(sums["wrong_shape"], None, "3 columns are a valid input for sums")
        self.assertEqual(sums["wrong_datatype"]["status"], "StatusCode.INVALID_ARGUMENT", got)
        self.assertIn("datatype BYTES", sums["wrong_datatype"]["message"])
        self.assertEqual(got["unknown_model"]["status"], "StatusCode.NOT_FOUND", got)
        # The calls went the gateway's REST path: counted in its metrics like any request.
        metrics = self.up.gw("GET", "/metrics").body.decode()
        self.assertRegex(metrics, r'flotilla_gateway_requests_total\{[^}]*endpoint="sums"')

    def test_straight_to_a_replica(self):
        python = harness.clients_python(self)
        model = control_test.model_path(control_test.PROBA)
        proc = subprocess.Popen([BIN, "replica", "--model", model, "--name", "iris",
                                 "--port", "0", "--grpc-port", "0", "--workers", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(lambda: proc.poll() is not None or (proc.kill(), proc.wait()))
        TRACKER.record(proc.pid)
        listening = json.loads(proc.stdout.readline())
        got = self.probe(python, listening["grpc_port"], "", "iris")
        self.assertTrue(got["live"] and got["ready"], got)
        rest = harness.req(listening["port"], "POST", "/v2/models/iris/infer",
                           oip_rows([[5.1, 3.5, 1.4, 0.2], [6.7, 3.1, 4.4, 1.4]])).json()
        self.assert_iris(got, rest)
        self.assertEqual(got["unknown_model"]["status"], "StatusCode.NOT_FOUND", got)
        # SIGTERM drains both ports and exits 0.
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 0)


if __name__ == "__main__":
    unittest.main()
