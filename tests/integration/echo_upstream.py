#!/usr/bin/python3
"""A stand-in upstream for the gateway's integration tests: a real HTTP/1.1 keep-alive
server process that answers any request with JSON echoing what it received.

It stands in for the LLM runtime, which does not exist yet: the gateway's OpenAI routes
(/v1/completions, /v1/chat/completions) and the headers the gateway forwards (traceparent,
X-Request-Id, Authorization stripped) can only be checked by an upstream that shows what it
was sent. The synthetic replica answers OIP requests only and does not echo headers.

    /usr/bin/python3 tests/integration/echo_upstream.py [--port 0]

Prints `{"event":"listening","host":"127.0.0.1","port":N}` as its first stdout line, as the
flotilla servers do, and exits 0 on SIGTERM or SIGINT. Every answer is 200 with

    {"method": "POST", "path": "/v1/completions?x=1",
     "headers": [["Host", "..."], ...], "body": "<request body as text>"}

(header names as received, in order).

A JSON request body with an "sse" object is answered instead with a Server-Sent Events stream
(text/event-stream, chunked, one chunk per event), so tests control its timing:

    {"sse": {"events": N, "delay_ms": D, "hold_file": PATH, "closed_file": PATH}}

sends `data: {"n": i}` for i in 0..N-1, D ms apart, then `data: [DONE]`. With "hold_file",
only the first event goes out before PATH exists (polled for at most 30 s; the stream is then
cut without [DONE]). With "closed_file", PATH is created when a write finds the connection
closed by the other side.
"""

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time


class EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, as a replica is

    def _echo(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        try:
            sse = json.loads(body).get("sse")
        except (ValueError, AttributeError):
            sse = None
        if isinstance(sse, dict):
            self._stream(sse)
            return
        payload = json.dumps({
            "method": self.command,
            "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body": body.decode("utf-8", "replace"),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _echo

    def _stream(self, sse):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        def chunk(data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        events = int(sse.get("events", 3))
        delay = float(sse.get("delay_ms", 0)) / 1000.0
        hold = sse.get("hold_file")
        try:
            for i in range(events):
                if i > 0 and delay:
                    time.sleep(delay)
                if i == 1 and hold:
                    deadline = time.monotonic() + 30
                    while not os.path.exists(hold):
                        if time.monotonic() > deadline:
                            self.close_connection = True
                            return
                        time.sleep(0.01)
                chunk(b"data: " + json.dumps({"n": i}).encode() + b"\n\n")
            chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            closed = sse.get("closed_file")
            if closed:
                with open(closed, "w"):
                    pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args):   # noqa: A002 (BaseHTTPRequestHandler's name)
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), EchoHandler)
    server.daemon_threads = True

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stdout.write(json.dumps({"event": "listening", "host": "127.0.0.1",
                                 "port": server.server_address[1]}) + "\n")
    sys.stdout.flush()
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
