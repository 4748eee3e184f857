"""`flotilla controller` against the fake API server (tests/fakes/kubernetes: a FAKE of the
Kubernetes API server that speaks its wire protocol, since none can run here). The controller
is the real process; the test plays the Deployment controller by writing each Deployment's
status, so every step of a rollout is reached on purpose: a ServingEndpoint becomes owned
Deployments and Services, the old version serves until the new one is ready, then it is scaled
to zero through the scale subresource and deleted; two controllers elect one leader, and the
second takes over a rollout the first left half done.
"""

import base64
import json
import os
import re
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes",
                                "kubernetes"))

import harness  # noqa: E402
from harness import FLOTILLA_BIN, req, wait_until  # noqa: E402
import control_test  # noqa: E402  (its bounded load client)
import fake_apiserver  # noqa: E402
import fake_kubelet  # noqa: E402

NS = "serving"
DEADLINE_S = 20.0


def setUpModule():
    harness.require_binary("kubernetes_controller_test.py")


def spec(version):
    return {"served_models": [{"name": version, "model": f"https://models.example/{version}.json",
                               "runtime": "xgboost", "concurrency": {"min": 1, "max": 64}}]}


class FakeClusterCase(unittest.TestCase):
    """A fake API server per test, a kubeconfig for it, and controller processes on demand."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="flotilla-k8s-controller-")
        self.addCleanup(lambda: __import__("shutil").rmtree(self.tmp, ignore_errors=True))
        self.api = fake_apiserver.FakeApiServer(port=0)
        self.port = self.api.start()
        self.addCleanup(self.api.stop)
        self.kubeconfig = self.api.write_kubeconfig(os.path.join(self.tmp, "kubeconfig"), NS)

    def start_controller(self, identity, lease_ms=1500, extra=()):
        return harness.start_process(
            self, [FLOTILLA_BIN, "controller", "--kubeconfig", self.kubeconfig,
                   "--identity", identity, "--api-addr", "127.0.0.1:0",
                   "--lease-duration-ms", str(lease_ms),
                   "--renew-deadline-ms", str(lease_ms * 2 // 3),
                   "--retry-period-ms", "100", "--resync-ms", "500", *extra])

    def leading(self, controller):
        return req(controller.port, "GET", "/health").json()["leading"]

    def deployment(self, name):
        return self.api.get("deployments", NS, name)

    def endpoint_status(self):
        se = self.api.get("servingendpoints", NS, "fraud")
        return (se or {}).get("status", {})

    def condition(self, type_):
        for c in self.endpoint_status().get("conditions", []):
            if c["type"] == type_:
                return c["status"]
        return None

    def traffic(self):
        return {v["name"]: v["traffic"] for v in self.endpoint_status().get("versions", [])}

    def report(self, name, ready, replicas=None):
        """What the Deployment controller would write: `ready` pods of the current template."""
        d = self.deployment(name)
        wanted = d["spec"]["replicas"] if replicas is None else replicas
        self.api.update_status("deployments", NS, name, {
            "observedGeneration": d["metadata"]["generation"], "replicas": wanted,
            "updatedReplicas": ready, "readyReplicas": ready, "availableReplicas": ready})



class ControllerTest(FakeClusterCase):
    """The test plays the Deployment controller."""

    def test_rollout_step_by_step_and_a_takeover_by_the_second_controller(self):
        first = self.start_controller("controller-a")
        wait_until(lambda: self.leading(first), DEADLINE_S, what="the first controller leading")
        second = self.start_controller("controller-b")

        self.api.create({"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
                         "metadata": {"name": "fraud", "namespace": NS}, "spec": spec("v1")})
        wait_until(lambda: self.deployment("fraud-v1") is not None, DEADLINE_S,
                   what="the v1 Deployment")
        self.assertFalse(self.leading(second), "two controllers lead")
        d = self.deployment("fraud-v1")
        se = self.api.get("servingendpoints", NS, "fraud")
        self.assertEqual(d["metadata"]["ownerReferences"][0]["uid"], se["metadata"]["uid"])
        self.assertEqual(d["metadata"]["labels"]["flotilla.dev/endpoint"], "fraud")
        self.assertEqual(d["spec"]["replicas"], 1)
        wait_until(lambda: self.api.get("services", NS, "fraud-v1") is not None, DEADLINE_S,
                   what="the v1 Service")
        wait_until(lambda: self.condition("Ready") == "False", DEADLINE_S, what="status written")
        self.assertEqual(self.endpoint_status()["observedGeneration"], 1)

        self.report("fraud-v1", ready=1)
        wait_until(lambda: self.condition("Ready") == "True", DEADLINE_S, what="v1 ready")
        self.assertEqual(self.traffic(), {"v1": 100})

        # The rollout to v2: v1 keeps the traffic while v2 is not ready.
        self.api.patch("servingendpoints", NS, "fraud", {"spec": spec("v2")})
        wait_until(lambda: self.deployment("fraud-v2") is not None, DEADLINE_S,
                   what="the v2 Deployment")
        wait_until(lambda: self.traffic() == {"v1": 100, "v2": 0}, DEADLINE_S,
                   what="v1 serving during the rollout")
        self.assertEqual(self.endpoint_status()["observedGeneration"], 2)
        self.assertEqual(self.deployment("fraud-v1")["spec"]["replicas"], 1)

        # The leader dies mid-rollout (no release): the second takes over after the lease.
        first.kill()
        wait_until(lambda: self.leading(second), DEADLINE_S, what="the second controller leading")
        self.report("fraud-v2", ready=1)
        wait_until(lambda: self.traffic() == {"v2": 100}, DEADLINE_S, what="traffic on v2")
        wait_until(lambda: self.deployment("fraud-v1")["spec"]["replicas"] == 0, DEADLINE_S,
                   what="v1 scaled to zero")
        scaled = [r for r in self.api.requests() if "deployments/fraud-v1/scale" in r]
        self.assertTrue(scaled, "v1 was not scaled through the scale subresource")
        self.assertIsNotNone(self.deployment("fraud-v1"), "v1 deleted before its pods were gone")

        self.report("fraud-v1", ready=0, replicas=0)
        wait_until(lambda: self.deployment("fraud-v1") is None, DEADLINE_S, what="v1 deleted")
        wait_until(lambda: self.api.get("services", NS, "fraud-v1") is None, DEADLINE_S,
                   what="v1's Service deleted")
        self.assertEqual(self.condition("Ready"), "True")

    def test_an_invalid_spec_is_degraded_and_changes_nothing(self):
        controller = self.start_controller("controller-a")
        wait_until(lambda: self.leading(controller), DEADLINE_S, what="leading")
        bad = spec("V_1")
        self.api.create({"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
                         "metadata": {"name": "fraud", "namespace": NS}, "spec": bad})
        wait_until(lambda: self.condition("Degraded") == "True", DEADLINE_S, what="Degraded")
        message = [c for c in self.endpoint_status()["conditions"]
                   if c["type"] == "Degraded"][0]["message"]
        self.assertIn("not a Kubernetes name", message)
        self.assertEqual(self.api.list("deployments", NS), [])

    def test_stopping_releases_the_lease_for_the_next_at_once(self):
        # A 120 s lease: only a released Lease lets the second lead within the test's deadline.
        first = self.start_controller("controller-a", lease_ms=120_000)
        wait_until(lambda: self.leading(first), DEADLINE_S, what="leading")
        second = self.start_controller("controller-b", lease_ms=120_000)
        first.stop()
        wait_until(lambda: self.leading(second), DEADLINE_S,
                   what="the second leading before the first's lease ran out")
        lease = self.api.get("leases", NS, "flotilla-controller")
        self.assertEqual(lease["spec"]["holderIdentity"], "controller-b")
        self.assertEqual(lease["spec"]["leaseTransitions"], 1)


class ApiTest(FakeClusterCase):
    """The REST API of `flotilla up`, served by the controller over ServingEndpoints and token
    ConfigMaps: `flotilla deploy` and the API write the objects `kubectl apply` would, tokens
    are ConfigMaps holding salted hashes (the gateways may read no Secret), bad input changes
    nothing. The test plays the Deployment controller."""

    def admin_token(self):
        record = self.api.get("configmaps", NS, "flotilla-admin-token")
        self.assertIsNotNone(record, "no admin token minted")
        self.assertEqual(record["metadata"]["labels"]["flotilla.dev/token"], "true")
        self.assertEqual(record["data"]["admin"], "true")
        secret = self.api.get("secrets", NS, "flotilla-admin-token")
        self.assertIsNotNone(secret, "no Secret holds the admin token")
        self.assertNotIn("labels", secret["metadata"])  # not a token object: no gateway reads it
        return base64.b64decode(secret["data"]["token"]).decode()

    def call(self, method, path, body=None, token=None):
        headers = {"Authorization": f"Bearer {token or self.token}"} if token != "" else {}
        return req(self.controller.port, method, path, body=body, headers=headers)

    def flotilla(self, *args):
        return harness.run_to_exit([FLOTILLA_BIN, *args, "--api",
                                    f"http://127.0.0.1:{self.controller.port}",
                                    "--token", self.token], deadline_s=20)

    def setUp(self):
        super().setUp()
        self.controller = self.start_controller("controller-a")
        wait_until(lambda: self.leading(self.controller), DEADLINE_S, what="leading")
        self.token = self.admin_token()

    def test_deploy_update_and_delete_write_the_serving_endpoint(self):
        spec_file = harness.write_yaml(self.tmp, "fraud.yaml", """name: fraud
served_models:
  - name: v1
    model: https://models.example/v1.json
    runtime: xgboost
    concurrency: {min: 1, max: 64}
""")
        deployed = self.flotilla("deploy", "-f", spec_file, "--no-wait")
        self.assertEqual(deployed.returncode, 0, deployed.stderr.decode())
        se = self.api.get("servingendpoints", NS, "fraud")
        self.assertEqual(se["spec"]["served_models"][0]["model"], "https://models.example/v1.json")
        self.assertEqual(se["metadata"]["annotations"]["flotilla.dev/updated-by"], "admin")
        wait_until(lambda: self.deployment("fraud-v1") is not None, DEADLINE_S,
                   what="the controller's Deployment for what the API wrote")

        view = self.call("GET", "/api/2.0/serving-endpoints/fraud").json()
        self.assertEqual(view["state"]["ready"], "NOT_READY")
        self.report("fraud-v1", ready=1)
        wait_until(lambda: self.call("GET", "/api/2.0/serving-endpoints/fraud")
                   .json()["state"] == {"ready": "READY", "config_update": "NOT_UPDATING"},
                   DEADLINE_S, what="READY once the Deployment is")
        view = self.call("GET", "/api/2.0/serving-endpoints/fraud").json()
        self.assertEqual([(v["name"], v["role"], v["traffic"], v["replicas_ready"])
                          for v in view["versions"]], [("v1", "target", 100, 1)])
        self.assertTrue(any(e["kind"] == "Ready=True" for e in view["events"]), view["events"])
        # `flotilla deploy` waits until it serves, as with `flotilla up`.
        self.assertEqual(self.flotilla("deploy", "-f", spec_file).returncode, 0)
        listed = self.call("GET", "/api/2.0/serving-endpoints").json()
        self.assertEqual([e["name"] for e in listed["endpoints"]], ["fraud"])
        # The list (two API calls, whatever the number of endpoints) shows what GET of each does.
        one = self.call("GET", "/api/2.0/serving-endpoints/fraud").json()
        for key in ("state", "versions", "replicas", "config"):
            self.assertEqual(listed["endpoints"][0][key], one[key], key)

        # An update is a new generation of the same object; the old version serves meanwhile.
        updated = self.call("PUT", "/api/2.0/serving-endpoints/fraud/config", spec("v2"))
        self.assertEqual(updated.status, 200, updated.body)
        se = self.api.get("servingendpoints", NS, "fraud")
        self.assertEqual(se["metadata"]["generation"], 2)
        self.assertEqual(se["spec"]["served_models"][0]["name"], "v2")
        wait_until(lambda: self.deployment("fraud-v2") is not None, DEADLINE_S, what="v2")
        wait_until(lambda: self.call("GET", "/api/2.0/serving-endpoints/fraud")
                   .json()["state"]["config_update"] == "IN_PROGRESS", DEADLINE_S,
                   what="a rollout in progress")
        roles = {v["name"]: (v["role"], v["traffic"]) for v in
                 self.call("GET", "/api/2.0/serving-endpoints/fraud").json()["versions"]}
        self.assertEqual(roles, {"v2": ("target", 0), "v1": ("previous", 100)})
        # The same spec again changes nothing (no new generation).
        self.call("PUT", "/api/2.0/serving-endpoints/fraud/config", spec("v2"))
        self.assertEqual(self.api.get("servingendpoints", NS, "fraud")["metadata"]["generation"],
                         2)

        deleted = self.call("DELETE", "/api/2.0/serving-endpoints/fraud")
        self.assertEqual(deleted.status, 200, deleted.body)
        self.assertIsNone(self.api.get("servingendpoints", NS, "fraud"))
        self.assertEqual(self.call("GET", "/api/2.0/serving-endpoints/fraud").status, 404)
        self.assertEqual(self.call("DELETE", "/api/2.0/serving-endpoints/fraud").status, 404)

    def test_bad_input_gets_a_clear_error_and_writes_nothing(self):
        missing = self.call("GET", "/api/2.0/serving-endpoints", token="")
        self.assertEqual(missing.status, 401)
        self.assertIn("kubectl get secret flotilla-admin-token", missing.json()["message"])
        self.assertEqual(self.call("GET", "/api/2.0/serving-endpoints",
                                   token="flt_admin_" + "0" * 64).status, 401)
        # The API server failing the token list: a 503 to retry, not a verdict on the token.
        self.api.fail_next(1, code=503, match=r"/configmaps")
        unavailable = self.call("GET", "/api/2.0/serving-endpoints")
        self.assertEqual(unavailable.status, 503, unavailable.body)
        self.assertEqual(unavailable.json()["error_code"], "TEMPORARILY_UNAVAILABLE")
        self.assertEqual(self.call("GET", "/api/2.0/serving-endpoints").status, 200)
        cases = [
            (b"{not json", "INVALID_PARAMETER_VALUE"),
            ({"name": "fraud", "served_models": []}, "INVALID_PARAMETER_VALUE"),
            # A valid spec for `flotilla up`, but v_1 makes no Kubernetes Service name.
            ({"name": "fraud", **{"served_models": [dict(spec("v1")["served_models"][0],
                                                         name="v_1")]}},
             "INVALID_PARAMETER_VALUE"),
        ]
        for body, code in cases:
            answer = self.call("POST", "/api/2.0/serving-endpoints", body)
            self.assertEqual(answer.status, 400, (body, answer.body))
            self.assertEqual(answer.json()["error_code"], code)
        self.assertIn("not a Kubernetes name", answer.json()["message"])
        self.assertEqual(self.api.list("servingendpoints", NS), [])

        self.assertEqual(self.call("POST", "/api/2.0/serving-endpoints",
                                   dict(spec("v1"), name="fraud")).status, 200)
        again = self.call("POST", "/api/2.0/serving-endpoints", dict(spec("v1"), name="fraud"))
        self.assertEqual((again.status, again.json()["error_code"]),
                         (409, "RESOURCE_ALREADY_EXISTS"))
        def spec_and_generation():
            # The controller writes the status meanwhile: only what the API may change counts.
            se = self.api.get("servingendpoints", NS, "fraud")
            return se["spec"], se["metadata"]["generation"]
        before = spec_and_generation()
        bad = self.call("PUT", "/api/2.0/serving-endpoints/fraud/config",
                        {"served_models": [{"name": "v2", "model": "/m.json",
                                            "concurrency": {"min": 5, "max": 1}}]})
        self.assertEqual(bad.status, 400, bad.body)
        self.assertEqual(spec_and_generation(), before)
        self.assertEqual(self.call("PUT", "/api/2.0/serving-endpoints/nope/config",
                                   spec("v1")).status, 404)

    def test_tokens_are_config_maps_of_hashes_that_scope_and_revoke(self):
        made = self.call("POST", "/api/2.0/tokens", {"id": "ci", "endpoints": ["fraud"],
                                                     "comment": "the CI job"})
        self.assertEqual(made.status, 200, made.body)
        token = made.json()["token"]
        record = self.api.get("configmaps", NS, "flotilla-token-ci")
        data = record["data"]
        self.assertEqual((data["id"], data["endpoints"], data["admin"]), ("ci", "fraud", "false"))
        self.assertNotIn("token", data)
        self.assertNotIn(token.split("_")[-1], json.dumps(record))
        self.assertEqual(record["metadata"]["annotations"]["flotilla.dev/comment"], "the CI job")
        self.assertIsNone(self.api.get("secrets", NS, "flotilla-token-ci"))
        self.assertEqual(self.call("POST", "/api/2.0/tokens", {"id": "ci"}).status, 409)
        # Another id that differs only in case is another token, in a ConfigMap of its own.
        other = self.call("POST", "/api/2.0/tokens", {"id": "CI"})
        self.assertEqual(other.status, 200, other.body)
        self.assertNotEqual(other.json()["token_info"]["config_map"], "flotilla-token-ci")
        self.assertEqual(self.call("DELETE", "/api/2.0/tokens/CI").status, 200)
        self.assertEqual(self.call("POST", "/api/2.0/tokens", {"id": "bad id!"}).status, 400)

        # Not an admin: the API refuses it; /metrics shows it only its endpoint's series.
        self.assertEqual(self.call("GET", "/api/2.0/serving-endpoints", token=token).status, 403)
        self.call("POST", "/api/2.0/serving-endpoints", dict(spec("v1"), name="fraud"))
        self.call("POST", "/api/2.0/serving-endpoints", dict(spec("v1"), name="other"))
        wait_until(lambda: 'endpoint="other"' in self.call("GET", "/metrics").body.decode(),
                   DEADLINE_S, what="the controller's status in the metrics")
        everything = self.call("GET", "/metrics").body.decode()
        self.assertIn("flotilla_controller_leading 1", everything)
        ok, output = harness.promtool_check_metrics(everything)
        self.assertTrue(ok, output)
        scoped = self.call("GET", "/metrics", token=token).body.decode()
        self.assertIn('flotilla_version_desired_replicas{endpoint="fraud",version="v1"} 1', scoped)
        self.assertNotIn('endpoint="other"', scoped)

        ids = sorted(t["id"] for t in self.call("GET", "/api/2.0/tokens").json()["tokens"])
        self.assertEqual(ids, ["admin", "ci"])
        self.assertEqual(self.call("DELETE", "/api/2.0/tokens/ci").status, 200)
        self.assertIsNone(self.api.get("configmaps", NS, "flotilla-token-ci"))
        self.assertEqual(self.call("DELETE", "/api/2.0/tokens/ci").status, 404)
        self.assertEqual(self.call("GET", "/metrics", token=token).status, 401)
        # The admin cannot revoke itself; once no admin token is left one is minted again, its
        # plaintext written over the old one's Secret.
        self.assertEqual(self.call("DELETE", "/api/2.0/tokens/admin").status, 400)
        old = self.token
        self.api.delete("configmaps", NS, "flotilla-admin-token")
        self.assertEqual(self.call("GET", "/api/2.0/tokens").status, 401)
        self.token = self.admin_token()
        self.assertNotEqual(self.token, old)
        self.assertEqual(self.call("GET", "/api/2.0/tokens").status, 200)

    def test_load_reports_need_the_gateways_key_which_deleting_its_secret_rotates(self):
        def report(key=None):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return req(self.controller.port, "POST", "/v1/samples",
                       body={"gateway": "gw-test", "capacity": ["nope"]}, headers=headers)

        def key():
            secret = self.api.get("secrets", NS, "flotilla-report-key")
            return secret and base64.b64decode(secret["data"]["key"]).decode()

        first = key()
        self.assertTrue(first, "no report key minted at start")
        self.assertEqual(report().status, 401)
        self.assertEqual(report(self.token).status, 401)  # not an API token's business
        self.assertEqual(report(first + "x").status, 401)
        self.assertEqual(report(first).status, 200)
        # Rotated: a report without a key (what a gateway sends when it finds no Secret) is
        # refused, and the controller, reading the Secret again (at most once a second), mints
        # a new key; the old one is refused from then on.
        self.api.delete("secrets", NS, "flotilla-report-key")
        wait_until(lambda: report().status == 401 and key() not in (None, first), DEADLINE_S,
                   what="a new report key")
        second = key()
        self.assertEqual(report(first).status, 401)
        self.assertEqual(report(second).status, 200)

    def test_token_secrets_of_an_earlier_release_move_to_config_maps_at_start(self):
        # Written as releases before ConfigMaps did: base64 data, the admin one with its
        # plaintext. A Secret that holds no valid token is left alone.
        self.controller.stop()
        made = harness.run_to_exit([FLOTILLA_BIN, "gateway", "mint-token", "--id", "old"])
        out = made.stdout.decode()
        b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
        old_token = re.search(r"token: (\S+)", out).group(1)
        self.api.create({"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": "token-old", "namespace": NS,
                                      "labels": {"flotilla.dev/token": "true"}},
                         "data": {"id": b64("old"), "endpoints": b64("fraud"),
                                  "salt": b64(re.search(r'salt: "([0-9a-f]+)"', out).group(1)),
                                  "sha256": b64(re.search(r'sha256: "([0-9a-f]+)"',
                                                          out).group(1))}})
        self.api.create({"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": "token-broken", "namespace": NS,
                                      "labels": {"flotilla.dev/token": "true"}},
                         "data": {"id": b64("broken")}})
        admin = self.api.get("configmaps", NS, "flotilla-admin-token")
        secret = self.api.get("secrets", NS, "flotilla-admin-token")
        self.api.delete("configmaps", NS, "flotilla-admin-token")
        self.api.delete("secrets", NS, "flotilla-admin-token")
        self.api.create({"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": "flotilla-admin-token", "namespace": NS,
                                      "labels": {"flotilla.dev/token": "true"}},
                         "data": {**{k: b64(v) for k, v in admin["data"].items()},
                                  "token": secret["data"]["token"]}})
        self.controller = self.start_controller("controller-b")
        wait_until(lambda: self.api.get("configmaps", NS, "token-old") is not None, DEADLINE_S,
                   what="the old token's ConfigMap")
        self.assertEqual(self.api.get("configmaps", NS, "token-old")["data"]["endpoints"],
                         "fraud")
        self.assertIsNone(self.api.get("secrets", NS, "token-old"))
        self.assertIsNotNone(self.api.get("secrets", NS, "token-broken"))
        self.assertIsNone(self.api.get("configmaps", NS, "token-broken"))
        # The same admin token, its hash moved, its plaintext kept where the operator reads it.
        self.assertEqual(self.admin_token(), self.token)
        wait_until(lambda: self.leading(self.controller), DEADLINE_S, what="leading")
        self.assertEqual(self.call("GET", "/api/2.0/tokens").status, 200)
        ids = sorted(t["id"] for t in self.call("GET", "/api/2.0/tokens").json()["tokens"])
        self.assertEqual(ids, ["admin", "old"])
        self.assertEqual(self.call("GET", "/api/2.0/serving-endpoints", token=old_token).status,
                         403)


class EndToEndTest(FakeClusterCase):
    """The real loop on the fake cluster: a ServingEndpoint applied → the controller's
    Deployment → the fake kubelet's real `flotilla replica` processes and EndpointSlices → the
    gateway routes → load → the gateway's samples at the controller → a scale-up through the
    scale subresource; a killed replica process is restarted; two controllers, one leading; a
    rollout under load that the standby finishes after the leader is killed in the middle;
    nothing failed throughout."""

    def setUp(self):
        super().setUp()
        self.kubelet = fake_kubelet.FakeKubelet(self.api, {"flotilla": os.path.abspath(FLOTILLA_BIN)},
                                                log_dir=os.path.join(self.tmp, "pods"))
        self.kubelet.start()
        self.addCleanup(self.kubelet.stop)
        self.token = harness.mint_token_config_map(self.api, NS, "ci")
        self.model = harness.write_yaml(self.tmp, "model.yaml",
                                        "service_time: {dist: fixed, mean_ms: 50}\ncpu_us: 0\n"
                                        "saturation: 100000\nseed: 1\n")

    def served(self, version, model=None):
        # 50 ms a request and a fixed per-replica target of 4: 16 clients need 4 replicas.
        return {"served_models": [{"name": version, "model": model or self.model,
                                   "runtime": "synthetic",
                                   "concurrency": {"min": 1, "max": 64},
                                   "per_replica_concurrency": {"min": 4, "max": 4}}]}

    def ready_pods(self, deployment):
        return [p for p in self.kubelet.pods()
                if p["deployment"] == deployment and p["ready"] and not p["terminating"]]

    def load(self, threads):
        client = types.SimpleNamespace(gateway_port=self.gateway.port, token=self.token)
        load = control_test.Load(client, "fraud", threads=threads, total=1_000_000,
                                 deadline_s=90, label=control_test.synthetic_label).start()
        self.addCleanup(load.stop)
        return load

    def start_autoscaling_controller(self, identity):
        """A controller with 1 s autoscaler periods and no scale-down within the test."""
        return self.start_controller(
            identity, extra=["--autoscale-period-ms", "1000", "--scale-up-window-ms", "5000",
                             "--scale-down-window-ms", "600000", "--vertical-period-ms", "1000"])

    def start_fleet(self):
        """A controller (leading) and a gateway; returns the controller."""
        controller = self.start_autoscaling_controller("controller-a")
        wait_until(lambda: self.leading(controller), DEADLINE_S, what="the controller leading")
        self.gateway = harness.start_process(
            self, [FLOTILLA_BIN, "gateway", "--kubernetes", "--kubeconfig", self.kubeconfig,
                   "--name", "gateway-a", "--listen", "127.0.0.1:0", "--workers", "1"])
        return controller

    def infer(self):
        return req(self.gateway.port, "POST", "/serving-endpoints/fraud/invocations",
                   {"instances": [[1.0]]}, {"Authorization": f"Bearer {self.token}"})

    def test_apply_route_scale_up_repair_and_roll_out_under_load(self):
        controller = self.start_fleet()
        standby = self.start_autoscaling_controller("controller-b")
        self.api.create({"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
                         "metadata": {"name": "fraud", "namespace": NS},
                         "spec": self.served("v1")})
        wait_until(lambda: len(self.ready_pods("fraud-v1")) == 1, 30, what="a ready v1 pod")
        wait_until(lambda: self.infer().status == 200, DEADLINE_S,
                   what="the gateway routing to the pod")
        lease = self.api.get("leases", NS, "flotilla-controller")
        self.assertEqual(lease["metadata"]["annotations"]["flotilla.dev/controller-address"],
                         f"127.0.0.1:{controller.port}")

        # 16 clients on replicas that take 4 each: the gateway's samples make the controller
        # scale the Deployment to 4 through the scale subresource.
        load = self.load(16)
        wait_until(lambda: len(self.ready_pods("fraud-v1")) >= 4, 40,
                   what="4 ready v1 pods under 16 clients")
        self.assertGreaterEqual(self.deployment("fraud-v1")["spec"]["replicas"], 4)
        self.assertTrue([r for r in self.api.requests() if "deployments/fraud-v1/scale" in r],
                        "not scaled through the scale subresource")
        status = self.endpoint_status()
        self.assertEqual(status["versions"][0]["targetConcurrencyPerReplica"], 4)
        self.assertEqual(status["autoscaler"]["target"], 4)
        # The vertical policy's readings come from the pods' own /metrics.
        wait_until(lambda: self.endpoint_status().get("usage", {}).get("replicasRead", 0) >= 4,
                   DEADLINE_S, what="the controller reading the 4 pods' usage")
        usage = self.endpoint_status()["usage"]
        self.assertTrue(0 <= usage["cpuUtilization"] <= 1, usage)

        self.assertFalse(self.leading(standby), "two controllers lead")

        # The leader keeps the endpoint's seconds from the gateway's reports; the standby
        # keeps none and says so.
        admin = base64.b64decode(self.api.get("secrets", NS, "flotilla-admin-token")["data"]
                                 ["token"]).decode()

        def metrics(port):
            return req(port, "GET", "/api/2.0/serving-endpoints/fraud/metrics?window=60s",
                       headers={"Authorization": f"Bearer {admin}"})
        seconds = wait_until(
            lambda: [s for s in metrics(controller.port).json()["samples"]
                     if s["requests"] > 0 and s["replicas"].get("v1", {}).get("ready", 0) >= 4],
            DEADLINE_S, what="the leader's seconds of fraud at 4 ready pods")
        self.assertGreater(seconds[-1]["codes"]["200"], 0, seconds[-1])
        self.assertGreater(seconds[-1]["latency_p50_ms"], 40, seconds[-1])  # 50 ms a request
        self.assertEqual(seconds[-1]["target_concurrency"], 4)
        self.assertEqual(metrics(standby.port).status, 503)

        # A replica process killed under load: restarted by the kubelet, nothing failed.
        victim = self.ready_pods("fraud-v1")[0]
        self.assertIsNotNone(self.kubelet.kill_pod_process(victim["name"], NS))
        wait_until(lambda: any(p["name"] == victim["name"] and p["ready"] and
                               p["restart_count"] >= 1 for p in self.kubelet.pods()),
                   30, what="the killed replica restarted and ready")

        # A rollout under load, the leader killed in the middle (SIGKILL: its Lease is not
        # released): v2's replicas take 3 s to load, so v1 still has the traffic when it dies.
        # The standby takes over once the Lease runs out and finishes the rollout:
        # v2 at the same scale, then v1 scaled to zero and deleted.
        slow_model = harness.write_yaml(self.tmp, "model-v2.yaml",
                                        "service_time: {dist: fixed, mean_ms: 50}\ncpu_us: 0\n"
                                        "saturation: 100000\nseed: 2\nload_ms: 3000\n")
        self.api.patch("servingendpoints", NS, "fraud", {"spec": self.served("v2", slow_model)})
        wait_until(lambda: self.deployment("fraud-v2") is not None, DEADLINE_S,
                   what="the v2 Deployment")
        controller.kill()
        self.assertEqual(self.traffic().get("v1"), 100, "the rollout ended before the kill")
        wait_until(lambda: self.leading(standby), DEADLINE_S, what="the standby leading")
        wait_until(lambda: self.traffic() == {"v2": 100}, 60, what="traffic on v2")
        self.assertEqual(self.api.get("leases", NS, "flotilla-controller")["spec"]
                         ["holderIdentity"], "controller-b")
        self.assertGreaterEqual(len(self.ready_pods("fraud-v2")), 4,
                                "v2 took the traffic before it had the scale")
        wait_until(lambda: self.deployment("fraud-v1") is None, 60, what="v1 deleted")
        completed = load.count()
        load.wait_for(lambda l: l.completed >= completed + 200, "200 requests on v2")
        load.stop()
        self.assertEqual(load.failures, [], f"{len(load.failures)} of {load.count()} failed")

    def test_slow_pods_start_hedged_and_a_restart_keeps_a_spare(self):
        """Pods that take 3 s to load, timed from their objects (creation to Ready): a scale-up
        starts as many more as are missing beside them (hedged starts), and once enough are
        ready the Deployment comes back under what the hedge asked for (the down window here
        is 600 s: only the hedge's cancellation lowers it). A container restart then counts as a
        replica failure: a spare. Nothing fails."""
        controller = self.start_fleet()
        slow_model = harness.write_yaml(self.tmp, "model-slow.yaml",
                                        "service_time: {dist: fixed, mean_ms: 50}\ncpu_us: 0\n"
                                        "saturation: 100000\nseed: 3\nload_ms: 3000\n")
        self.api.create({"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
                         "metadata": {"name": "fraud", "namespace": NS},
                         "spec": self.served("v1", slow_model)})
        wait_until(lambda: len(self.ready_pods("fraud-v1")) == 1, 30, what="a ready v1 pod")
        wait_until(lambda: self.infer().status == 200, DEADLINE_S,
                   what="the gateway routing to the pod")
        load = self.load(16)

        def counts(pattern):
            return [int(n) for n in re.findall(pattern, controller.stderr())]
        wait_until(lambda: counts(r"hedged starts: (\d+) replicas"), 40,
                   what="hedged starts in the controller's log")
        wait_until(lambda: len(self.ready_pods("fraud-v1")) >= 4, 60,
                   what="4 ready v1 pods under 16 clients")

        def hedge_cancelled():
            decided = counts(r"horizontal: \d+ -> (\d+) replicas")[-1]
            replicas = self.deployment("fraud-v1")["spec"]["replicas"]
            return replicas == decided and decided < max(counts(r"hedged starts: (\d+) replicas"))
        wait_until(hedge_cancelled, 30,
                   what="the Deployment back at the decided count, under what the hedge asked for")
        # A pod's container restarting is a replica failure: with starts this slow, a spare.
        self.assertIsNotNone(self.kubelet.kill_pod_process(self.ready_pods("fraud-v1")[0]["name"],
                                                           NS))
        wait_until(lambda: "(with a spare: a replica failed)" in controller.stderr(), 30,
                   what="a spare after the restart")
        completed = load.count()
        load.wait_for(lambda l: l.completed >= completed + 100, "100 more requests")
        load.stop()
        self.assertEqual(load.failures, [], f"{len(load.failures)} of {load.count()} failed")

    def test_a_request_to_an_endpoint_at_zero_starts_a_replica(self):
        self.start_fleet()
        spec = self.served("v1")
        spec["served_models"][0].update({"concurrency": {"min": 0, "max": 8},
                                         "scale_to_zero": True})
        self.api.create({"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
                         "metadata": {"name": "fraud", "namespace": NS}, "spec": spec})
        wait_until(lambda: self.condition("Ready") == "True", DEADLINE_S, what="status written")
        self.assertEqual(self.deployment("fraud-v1")["spec"]["replicas"], 0)
        self.assertEqual(self.kubelet.pods(), [])
        # The gateway learns the endpoint from its own watch, after the status is written: an
        # unknown version of a known endpoint is refused without waking it.
        wait_until(lambda: b"has no version" in req(
            self.gateway.port, "POST", "/v2/models/fraud/versions/none/infer",
            {"inputs": []}, {"Authorization": f"Bearer {self.token}"}).body,
                   DEADLINE_S, what="the gateway knowing the endpoint")
        self.assertEqual(self.deployment("fraud-v1")["spec"]["replicas"], 0)
        # The gateway holds the request and asks the controller for capacity.
        r = self.infer()
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(self.deployment("fraud-v1")["spec"]["replicas"], 1)


if __name__ == "__main__":
    unittest.main()
