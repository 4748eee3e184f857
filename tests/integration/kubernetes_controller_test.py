"""`flotilla controller` against the fake API server (tests/fakes/kubernetes: a FAKE of the
Kubernetes API server that speaks its wire protocol, since none can run here). The controller
is the real process; the test plays the Deployment controller by writing each Deployment's
status, so every step of a rollout is reached on purpose: a ServingEndpoint becomes owned
Deployments and Services, the old version serves until the new one is ready, then it is scaled
to zero through the scale subresource and deleted; two controllers elect one leader, and the
second takes over a rollout the first left half done.
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes",
                                "kubernetes"))

import harness  # noqa: E402
from harness import FLOTILLA_BIN, req, wait_until  # noqa: E402
import fake_apiserver  # noqa: E402

NS = "serving"
DEADLINE_S = 20.0


def setUpModule():
    harness.require_binary("kubernetes_controller_test.py")


def spec(version):
    return {"served_models": [{"name": version, "model": f"https://models.example/{version}.json",
                               "runtime": "xgboost", "concurrency": {"min": 1, "max": 64}}]}


class ControllerTest(unittest.TestCase):
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

    def start_controller(self, identity, lease_ms=1500):
        return harness.start_process(
            self, [FLOTILLA_BIN, "controller", "--kubeconfig", self.kubeconfig,
                   "--identity", identity, "--api-addr", "127.0.0.1:0",
                   "--lease-duration-ms", str(lease_ms),
                   "--renew-deadline-ms", str(lease_ms * 2 // 3),
                   "--retry-period-ms", "100", "--resync-ms", "500"])

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


if __name__ == "__main__":
    unittest.main()
