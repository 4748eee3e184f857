"""Traces (issue 23 item 2, docs/tracing.md): W3C traceparent in and out, spans from the
gateway, the replicas and the LLM engine, exported as OTLP/HTTP JSON and decoded by a receiver
built on the official OpenTelemetry protobuf definitions (otlp_receiver.py, run by the pinned
clients venv; the tests skip when PyPI cannot be reached to make it).

- Through `flotilla up --otlp-endpoint` (the replicas get the flag from it): an xgboost
  endpoint and a tiny random Llama, each request's spans checked for ids, parents, kinds and
  attributes across the two processes.
- A standalone `flotilla gateway` in front of the echo upstream: what traceparent the replica
  is sent when the gateway samples, when it does not, and when tracing is off; and the drop
  counter when the collector cannot be reached.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import control_test  # noqa: E402  (flotilla up and its model fixtures)
import gateway_test  # noqa: E402  (flotilla gateway, the echo upstream)
import harness  # noqa: E402
from control_test import ControlTestCase, served, spec  # noqa: E402
from harness import parse_metrics, wait_until  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")
SPANS_DEADLINE_S = 30
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def setUpModule():
    control_test.setUpModule()
    gateway_test.setUpModule()


def tearDownModule():
    gateway_test.tearDownModule()
    control_test.tearDownModule()


class Receiver:
    """otlp_receiver.py on a port of its own; spans() reads what it decoded so far."""

    def __init__(self, owner, python):
        fd, self.path = tempfile.mkstemp(prefix="spans-", suffix=".jsonl",
                                         dir=control_test.fresh_dir("receiver"))
        os.close(fd)
        self.srv = harness.start_process(
            owner, [python, os.path.join(HERE, "otlp_receiver.py"), self.path], cls_level=True)
        self.url = f"http://127.0.0.1:{self.srv.port}/v1/traces"

    def lines(self):
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def spans(self, trace_id=None):
        lines = self.lines()
        errors = [line["error"] for line in lines if "error" in line]
        if errors:
            raise AssertionError(f"the receiver could not decode an export: {errors[:3]}")
        return [s for s in lines if trace_id is None or s["trace_id"] == trace_id]

    def wait_for(self, trace_id, pred, what):
        last = {}

        def check():
            last["spans"] = self.spans(trace_id)
            return last["spans"] if pred(last["spans"]) else None
        try:
            return wait_until(check, SPANS_DEADLINE_S, interval_s=0.05, what=what)
        except AssertionError as e:
            names = [(s["service"], s["name"]) for s in last.get("spans", [])]
            raise AssertionError(f"{e}; spans of the trace so far: {names}") from None


def by_name(spans, service, name):
    found = [s for s in spans if s["service"] == service and s["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"expected one {service} span {name!r}, got {len(found)}: "
                             f"{[(s['service'], s['name']) for s in spans]}")
    return found[0]


def names(spans, service):
    return sorted(s["name"] for s in spans if s["service"] == service)


class TracesThroughUp(ControlTestCase):
    """`flotilla up --otlp-endpoint` with an xgboost endpoint and a language model."""

    @classmethod
    def setUpClass(cls):
        # A test case for the skip, before anything starts.
        probe = cls("test_a_sampled_parent_is_continued_across_gateway_and_replica")
        cls.python = harness.clients_python(probe)
        cls.receiver = Receiver(cls, cls.python)
        llm_dir = control_test.fresh_dir("llm")
        subprocess.run(["/usr/bin/python3", os.path.join(FIXTURES, "make_tokenizers.py"),
                        llm_dir], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["/usr/bin/python3", os.path.join(FIXTURES, "make_llm.py"), llm_dir,
                        "--with-tokenizer", os.path.join(llm_dir, "llama3")], check=True,
                       stdout=subprocess.DEVNULL)
        saved = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
        os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # the replicas inherit it
        try:
            cls.up = cls.start_up("--otlp-endpoint", cls.receiver.url, "--warm-pool", "0")
        finally:
            if saved is None:
                os.environ.pop("OTEL_BSP_SCHEDULE_DELAY")
            else:
                os.environ["OTEL_BSP_SCHEDULE_DELAY"] = saved
        cls.tree = spec("tree", served("m", "multiclass.ubj"))
        cls.chat = spec("chat", served("llm", os.path.join(llm_dir, "chat"), runtime="llm"))
        cls.up.create(cls.tree)
        cls.up.create(cls.chat)
        cls.up.wait_serving("tree", cls.tree)
        cls.up.wait_serving("chat", cls.chat)

    def invoke(self, headers=None):
        r = self.up.gw("POST", "/serving-endpoints/tree/invocations",
                       control_test.mlflow_body(), headers=headers)
        self.assertEqual(r.status, 200, r)
        return r

    def test_a_sampled_parent_is_continued_across_gateway_and_replica(self):
        self.invoke({"traceparent": f"00-{TRACE}-{PARENT}-01"})
        spans = self.receiver.wait_for(
            TRACE, lambda s: "encode" in names(s, "flotilla-replica") and
            "POST tree" in names(s, "flotilla-gateway"), "the request's spans from both")
        gateway = by_name(spans, "flotilla-gateway", "POST tree")
        self.assertEqual(gateway["parent_span_id"], PARENT)
        self.assertEqual(gateway["kind"], "SPAN_KIND_SERVER")
        self.assertEqual(gateway["attributes"]["http.response.status_code"], 200)
        self.assertEqual(gateway["attributes"]["flotilla.endpoint"], "tree")
        self.assertEqual(gateway["attributes"]["flotilla.attempts"], 1)
        self.assertEqual(gateway["status"], "STATUS_CODE_UNSET")
        auth = by_name(spans, "flotilla-gateway", "auth")  # up's gateway checks tokens
        upstream = by_name(spans, "flotilla-gateway", "upstream")
        for child in (auth, upstream):
            self.assertEqual(child["parent_span_id"], gateway["span_id"], child)
            self.assertLessEqual(gateway["start"], child["start"])
            self.assertLessEqual(child["end"], gateway["end"])
        self.assertEqual(upstream["kind"], "SPAN_KIND_CLIENT")
        self.assertEqual(upstream["attributes"]["http.response.status_code"], 200)
        self.assertEqual(upstream["attributes"]["server.address"], "127.0.0.1")

        replica = by_name(spans, "flotilla-replica", "POST invocations")
        self.assertEqual(replica["parent_span_id"], upstream["span_id"])
        self.assertEqual(replica["kind"], "SPAN_KIND_SERVER")
        self.assertEqual(replica["attributes"]["http.response.status_code"], 200)
        self.assertEqual(replica["resource"]["flotilla.endpoint"], "tree")
        self.assertEqual(replica["attributes"]["flotilla.request_id"],
                         gateway["attributes"]["flotilla.request_id"])
        pieces = [by_name(spans, "flotilla-replica", n) for n in ("decode", "inference", "encode")]
        for piece in pieces:
            self.assertEqual(piece["parent_span_id"], replica["span_id"], piece)
        self.assertEqual(pieces[1]["attributes"]["flotilla.rows"], 1)
        # In order, inside the replica's span (one process's clock; the gateway's spans are
        # timed by another process's, so no order across the two is asserted).
        self.assertLessEqual(replica["start"], pieces[0]["start"])
        self.assertLessEqual(pieces[0]["end"], pieces[1]["start"])
        self.assertLessEqual(pieces[1]["end"], pieces[2]["start"])
        self.assertLessEqual(pieces[2]["end"], replica["end"])

    def test_b_a_request_without_traceparent_starts_a_trace_the_replica_joins(self):
        r = self.invoke()
        request_id = r.headers["x-request-id"]

        def mine():
            return [s for s in self.receiver.spans()
                    if s["attributes"].get("flotilla.request_id") == request_id]
        found = wait_until(lambda: len(mine()) == 2 and mine(), SPANS_DEADLINE_S,
                           what="the gateway's and the replica's server spans")
        gateway = next(s for s in found if s["service"] == "flotilla-gateway")
        replica = next(s for s in found if s["service"] == "flotilla-replica")
        self.assertEqual(gateway["parent_span_id"], "", "a root")
        self.assertEqual(replica["trace_id"], gateway["trace_id"])
        upstream = by_name(self.receiver.spans(gateway["trace_id"]), "flotilla-gateway",
                           "upstream")
        self.assertEqual(replica["parent_span_id"], upstream["span_id"])

    def test_c_an_unsampled_parent_records_nothing_anywhere(self):
        unsampled = "5bf92f3577b34da6a3ce929d0e0e4736"
        self.invoke({"traceparent": f"00-{unsampled}-{PARENT}-00"})
        # Each process exports in order: once a later sampled request's spans from both are in,
        # the unsampled one's would be too.
        later = "6bf92f3577b34da6a3ce929d0e0e4736"
        self.invoke({"traceparent": f"00-{later}-{PARENT}-01"})
        self.receiver.wait_for(later, lambda s: "encode" in names(s, "flotilla-replica") and
                               "POST tree" in names(s, "flotilla-gateway"), "the later request")
        self.assertEqual(self.receiver.spans(unsampled), [])

    def test_d_the_llm_engine_shows_its_queue_prefill_and_decode(self):
        trace_id = "7bf92f3577b34da6a3ce929d0e0e4736"
        r = self.up.gw("POST", "/v1/completions",
                       {"model": "chat", "prompt": "hello there", "max_tokens": 5,
                        "temperature": 0, "ignore_eos": True},
                       headers={"traceparent": f"00-{trace_id}-{PARENT}-01"})
        self.assertEqual(r.status, 200, r)
        spans = self.receiver.wait_for(
            trace_id, lambda s: "POST completions" in names(s, "flotilla-replica") and
            "POST chat" in names(s, "flotilla-gateway"), "the generation's spans")
        replica = by_name(spans, "flotilla-replica", "POST completions")
        self.assertEqual(replica["attributes"]["gen_ai.usage.output_tokens"], 5)
        self.assertGreater(replica["attributes"]["gen_ai.usage.input_tokens"], 0)
        self.assertGreater(replica["attributes"]["flotilla.llm.time_to_first_token_ms"], 0)
        self.assertEqual(replica["attributes"]["gen_ai.request.model"], "chat")
        queue, prefill, decode = (by_name(spans, "flotilla-replica", n)
                                  for n in ("llm queue", "llm prefill", "llm decode"))
        for piece in (queue, prefill, decode):
            self.assertEqual(piece["parent_span_id"], replica["span_id"], piece)
        self.assertLessEqual(queue["end"], prefill["start"])
        self.assertLessEqual(prefill["end"], decode["start"])
        self.assertLessEqual(decode["end"], replica["end"])
        self.assertEqual(decode["attributes"]["gen_ai.usage.output_tokens"], 5)
        upstream = by_name(spans, "flotilla-gateway", "upstream")
        self.assertEqual(replica["parent_span_id"], upstream["span_id"])

    def test_d2_a_refused_request_has_the_gateways_span_alone(self):
        trace_id = "8bf92f3577b34da6a3ce929d0e0e4736"
        r = self.up.gw("POST", "/serving-endpoints/tree/invocations",
                       control_test.mlflow_body(), token=None,
                       headers={"traceparent": f"00-{trace_id}-{PARENT}-01"})
        self.assertEqual(r.status, 401, r)
        spans = self.receiver.wait_for(trace_id, lambda s: len(s) >= 1, "the refusal's span")
        self.assertEqual([(s["service"], s["name"]) for s in spans],
                         [("flotilla-gateway", "POST tree")])
        self.assertEqual(spans[0]["attributes"]["http.response.status_code"], 401)
        self.assertEqual(spans[0]["parent_span_id"], PARENT)
        self.assertEqual(spans[0]["attributes"]["flotilla.request_id"], r.headers["x-request-id"])

    def test_e_the_exporters_count_what_they_sent(self):
        r = self.up.gw("GET", "/metrics")
        self.assertEqual(r.status, 200, r)
        metrics = parse_metrics(r.body.decode())
        self.assertGreater(metrics[("flotilla_trace_spans_exported_total", frozenset())], 0)
        self.assertEqual(metrics[("flotilla_trace_spans_dropped_total", frozenset())], 0)


class GatewayPropagation(gateway_test.GatewayTestCase):
    """What the replica is sent, from a standalone gateway in front of the echo upstream."""

    @classmethod
    def setUpClass(cls):
        cls.echo = gateway_test.start_echo(cls, cls_level=True)
        cls.config = gateway_test.config_yaml(
            {"e": [gateway_test.ver("v1", [gateway_test.rep("e1", cls.echo)])]})

    def sent_traceparent(self, gw, header=None):
        headers = {"Content-Type": "application/json"}
        if header is not None:
            headers["traceparent"] = header
        r = gw.req("POST", "/serving-endpoints/e/invocations", b"{}", headers)
        self.assertEqual(r.status, 200, r)
        sent = [v for k, v in r.json()["headers"] if k.lower() == "traceparent"]
        self.assertLessEqual(len(sent), 1, sent)
        return sent[0] if sent else None

    def test_unsampled_traces_still_carry_the_decision_to_the_replica(self):
        # Ratio 0, and a collector nobody listens on: nothing is recorded, nothing dropped.
        gw = gateway_test.Gateway(self, self.config, {
            "--otlp-endpoint": f"http://127.0.0.1:{gateway_test.RefusingPort(self).port}/v1/traces",
            "--trace-sample-ratio": "0"})
        root = self.sent_traceparent(gw)
        self.assertRegex(root, r"^00-[0-9a-f]{32}-[0-9a-f]{16}-00$")
        replaced = self.sent_traceparent(gw, "00-not-a-traceparent")
        self.assertRegex(replaced, r"^00-[0-9a-f]{32}-[0-9a-f]{16}-00$")
        self.assertNotEqual(replaced.split("-")[1], root.split("-")[1])
        kept = f"00-{TRACE}-{PARENT}-00"
        self.assertEqual(self.sent_traceparent(gw, kept), kept, "an unsampled parent passes")
        metrics = gw.metrics()
        self.assertEqual(metrics[("flotilla_trace_spans_dropped_total", frozenset())], 0)

    def test_a_sampled_request_gets_the_attempt_as_parent_and_failed_exports_are_counted(self):
        gw = gateway_test.Gateway(self, self.config, {
            "--otlp-endpoint": f"http://127.0.0.1:{gateway_test.RefusingPort(self).port}/v1/traces"})
        sent = self.sent_traceparent(gw, f"00-{TRACE}-{PARENT}-01")
        version, trace_id, parent, flags = sent.split("-")
        self.assertEqual((version, trace_id, flags), ("00", TRACE, "01"))
        self.assertNotEqual(parent, PARENT, "the gateway's upstream attempt is the parent")
        # Its spans (server, upstream) cannot be delivered: dropped and counted.
        wait_until(lambda: gw.metrics()[("flotilla_trace_spans_dropped_total",
                                         frozenset())] >= 2,
                   SPANS_DEADLINE_S, interval_s=0.1, what="the undelivered spans counted")
        self.assertGreaterEqual(
            gw.metrics()[("flotilla_trace_export_failures_total", frozenset())], 1)

    def test_without_an_endpoint_traceparent_passes_unchanged(self):
        gw = gateway_test.Gateway(self, self.config)
        header = f"00-{TRACE}-{PARENT}-01"
        self.assertEqual(self.sent_traceparent(gw, header), header)
        self.assertIsNone(self.sent_traceparent(gw))
        self.assertNotIn("flotilla_trace_spans_exported_total", gw.metrics_text())

    def test_a_bad_endpoint_or_ratio_is_refused_at_start(self):
        for flags, env, needle in (
                (["--otlp-endpoint", "grpc://127.0.0.1:4317"], {}, "--otlp-endpoint"),
                ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
                 "OTEL_EXPORTER_OTLP_ENDPOINT"),
                ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                      "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG")):
            p = subprocess.run([harness.FLOTILLA_BIN, "gateway", "--listen", "127.0.0.1:0",
                                "--upstreams", "127.0.0.1:1", *flags],
                               env=dict(os.environ, **env), capture_output=True, timeout=10)
            self.assertEqual(p.returncode, 2, (flags, env, p.stderr))
            self.assertIn(needle, p.stderr.decode(), (flags, env))


if __name__ == "__main__":
    unittest.main()
