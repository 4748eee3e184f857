#!/usr/bin/python3
"""Bounded closed-loop load for the demo and bench/control: THREADS clients, each on its own
keep-alive connection, POST the same body to URL until STOP_FILE exists (or --max-seconds
pass), then print one JSON line: requests, failed (any status other than 200, or a connection
error), status counts, and the first few failures."""
import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--body", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-seconds", type=float, default=120)
    args = parser.parse_args()

    url = urllib.parse.urlsplit(args.url)
    headers = {"Content-Type": "application/json"}
    if args.token:
        headers["Authorization"] = "Bearer " + args.token
    deadline = time.monotonic() + args.max_seconds
    lock = threading.Lock()
    counts = {"requests": 0, "failed": 0, "codes": {}, "failures": []}

    def record(code, detail=""):
        with lock:
            counts["requests"] += 1
            counts["codes"][str(code)] = counts["codes"].get(str(code), 0) + 1
            if code != 200:
                counts["failed"] += 1
                if len(counts["failures"]) < 5:
                    counts["failures"].append(f"{code}: {detail[:200]}")

    def client():
        connection = None
        while not os.path.exists(args.stop_file) and time.monotonic() < deadline:
            try:
                if connection is None:
                    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
                connection.request("POST", url.path, body=args.body, headers=headers)
                response = connection.getresponse()
                payload = response.read().decode(errors="replace")
                record(response.status, payload)
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as error:
                record("error", repr(error))
                connection = None

    threads = [threading.Thread(target=client) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
