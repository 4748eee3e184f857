"""`flotilla controller` against the fake API server (tests/fakes/kubernetes: a FAKE of the
Kubernetes API server that speaks its wire protocol, since none can run here). The controller
is the real process; the test plays the Deployment controller by writing each Deployment's
status, so every step of a rollout is reached on purpose: a ServingEndpoint becomes owned
Deployments and Services, the old version serves until the new one is ready, then it is scaled
to zero through the scale subresource and deleted; two controllers elect one leader, and the
second takes over a rollout the first left half done.
"""

import base64
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
        self.kubeconfig = os.path.join(self.tmp, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(f"""current-context: t
clusters: [{{name: fake, cluster: {{server: "http://127.0.0.1:{self.port}"}}}}]
contexts: [{{name: t, context: {{cluster: fake, namespace: {NS}}}}}]
""")

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



class ControllerTest(FakeClusterCase):
    """The test plays the Deployment controller."""

    def report(self, name, ready, replicas=None):
        """What the Deployment controller would write: `ready` pods of the current template."""
        d = self.deployment(name)
        wanted = d["spec"]["replicas"] if replicas is None else replicas
        self.api.update_status("deployments", NS, name, {
            "observedGeneration": d["metadata"]["generation"], "replicas": wanted,
            "updatedReplicas": ready, "readyReplicas": ready, "availableReplicas": ready})

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


class EndToEndTest(FakeClusterCase):
    """The real loop on the fake cluster: a ServingEndpoint applied → the controller's
    Deployment → the fake kubelet's real `flotilla replica` processes and EndpointSlices → the
    gateway routes → load → the gateway's samples at the controller → a scale-up through the
    scale subresource; a killed replica process is restarted; a rollout under load; nothing
    failed throughout."""

    def setUp(self):
        super().setUp()
        self.kubelet = fake_kubelet.FakeKubelet(self.api, {"flotilla": os.path.abspath(FLOTILLA_BIN)},
                                                log_dir=os.path.join(self.tmp, "pods"))
        self.kubelet.start()
        self.addCleanup(self.kubelet.stop)
        minted = harness.run_to_exit([FLOTILLA_BIN, "gateway", "mint-token", "--id", "ci"])
        self.assertEqual(minted.returncode, 0, minted)
        out = minted.stdout.decode()
        self.token = re.search(r"token: (\S+)", out).group(1)
        b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
        self.api.create({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "token-ci", "namespace": NS,
                         "labels": {"flotilla.dev/token": "true"}},
            "type": "Opaque",
            "data": {"id": b64("ci"),
                     "salt": b64(re.search(r'salt: "([0-9a-f]+)"', out).group(1)),
                     "sha256": b64(re.search(r'sha256: "([0-9a-f]+)"', out).group(1))}})
        self.model = harness.write_yaml(self.tmp, "model.yaml",
                                        "service_time: {dist: fixed, mean_ms: 50}\ncpu_us: 0\n"
                                        "saturation: 100000\nseed: 1\n")

    def served(self, version):
        # 50 ms a request and a fixed per-replica target of 4: 16 clients need 4 replicas.
        return {"served_models": [{"name": version, "model": self.model, "runtime": "synthetic",
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

    def start_fleet(self):
        """A controller (leading, a 1 s autoscaler period, no scale-down within the test) and
        a gateway; returns the controller."""
        controller = self.start_controller(
            "controller-a", extra=["--autoscale-period-ms", "1000", "--scale-up-window-ms",
                                   "5000", "--scale-down-window-ms", "600000"])
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

        # A replica process killed under load: restarted by the kubelet, nothing failed.
        victim = self.ready_pods("fraud-v1")[0]
        self.assertIsNotNone(self.kubelet.kill_pod_process(victim["name"], NS))
        wait_until(lambda: any(p["name"] == victim["name"] and p["ready"] and
                               p["restart_count"] >= 1 for p in self.kubelet.pods()),
                   30, what="the killed replica restarted and ready")

        # A rollout under load: v2 at the same scale, then v1 scaled to zero and deleted.
        self.api.patch("servingendpoints", NS, "fraud", {"spec": self.served("v2")})
        wait_until(lambda: self.traffic() == {"v2": 100}, 60, what="traffic on v2")
        self.assertGreaterEqual(len(self.ready_pods("fraud-v2")), 4,
                                "v2 took the traffic before it had the scale")
        wait_until(lambda: self.deployment("fraud-v1") is None, 60, what="v1 deleted")
        completed = load.count()
        load.wait_for(lambda l: l.completed >= completed + 200, "200 requests on v2")
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
        # The gateway holds the request and asks the controller for capacity.
        r = self.infer()
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(self.deployment("fraud-v1")["spec"]["replicas"], 1)


if __name__ == "__main__":
    unittest.main()
