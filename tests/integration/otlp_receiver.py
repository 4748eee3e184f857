"""An OTLP/HTTP trace receiver for the trace tests, run by the clients venv's python
(clients_venv.sh): it decodes every export with the official OpenTelemetry protobuf
definitions (`opentelemetry-proto`), strictly, as a collector would.

    <venv>/bin/python tests/integration/otlp_receiver.py OUT_FILE

Prints `{"event":"listening","host":"127.0.0.1","port":N}` first on stdout. Each POST to
/v1/traces must be `application/json` (OTLP's protobuf-JSON encoding); its body is parsed into
an ExportTraceServiceRequest with unknown fields refused. OTLP/JSON writes trace and span ids
as hex, not protobuf-JSON's base64 (the OTLP specification's one deviation), so they are
turned into base64 first and must decode to exactly 16 and 8 bytes. Every span is appended to
OUT_FILE as one JSON line:

    {"service": ..., "resource": {key: value}, "trace_id": hex, "span_id": hex,
     "parent_span_id": hex or "", "name": ..., "kind": "SPAN_KIND_SERVER", "start": ns,
     "end": ns, "attributes": {key: value}, "status": "STATUS_CODE_ERROR"|..., "message": ...}

An export that does not decode gets 400 and a line {"error": "..."}. SIGTERM ends it.
"""

import base64
import binascii
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

ID_BYTES = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def hex_ids_to_base64(body):
    """OTLP/JSON's hex ids as protobuf-JSON's base64, checking their length."""
    for resource_spans in body.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for field, size in ID_BYTES.items():
                    if field not in span:
                        continue
                    raw = binascii.unhexlify(span[field])
                    if len(raw) != size or span[field] != span[field].lower():
                        raise ValueError(f"{field} {span[field]!r}: not {size} bytes of "
                                         "lower-case hex")
                    span[field] = base64.b64encode(raw).decode()
    return body


def any_value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def spans_of(request):
    for resource_spans in request.resource_spans:
        resource = {a.key: any_value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": resource.get("service.name"),
                    "resource": resource,
                    "scope": scope_spans.scope.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": Span.SpanKind.Name(span.kind),
                    "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano,
                    "attributes": {a.key: any_value(a.value) for a in span.attributes},
                    "status": Status.StatusCode.Name(span.status.code),
                    "message": span.status.message,
                }


def main():
    out_path = sys.argv[1]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                if self.path != "/v1/traces":
                    raise ValueError(f"path {self.path}")
                if self.headers.get("Content-Type", "").split(";")[0] != "application/json":
                    raise ValueError(f"content type {self.headers.get('Content-Type')!r}")
                request = ExportTraceServiceRequest()
                json_format.Parse(json.dumps(hex_ids_to_base64(json.loads(body))), request,
                                  ignore_unknown_fields=False)
                lines = [json.dumps(span) for span in spans_of(request)]
            except Exception as e:  # noqa: BLE001 - any failure is the exporter's fault
                lines = [json.dumps({"error": f"{type(e).__name__}: {e}"})]
                status, answer = 400, json.dumps({"error": str(e)}).encode()
            else:
                status = 200
                answer = json_format.MessageToJson(ExportTraceServiceResponse()).encode()
            with open(out_path, "a") as f:
                f.write("".join(line + "\n" for line in lines))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    Handler.protocol_version = "HTTP/1.1"  # keep-alive, as collectors answer
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"event": "listening", "host": "127.0.0.1",
                      "port": server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
