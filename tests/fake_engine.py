"""A stand-in OpenAI-compatible engine for ``engine.serve``'s tests: ``python -m tests.fake_engine --port P``.

It answers ``GET /v1/models`` (its model, and the ``Authorization`` header it was sent: a server that
echoes a key), ``GET /version`` and ``POST /v1/completions`` deterministically (each prompt's last number
of three digits or more: a passkey task's needle). Flags make it fail as servers do: exit at once, never
answer, die after some completions, answer slowly, ignore SIGTERM. It prints its pid and port first.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer(prompt: str) -> str:
    numbers = re.findall(r"\d{3,}", prompt)
    return " " + (numbers[-1] if numbers else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake")
    parser.add_argument("--exit-at-once", type=int, default=None, help="exit with this code before serving")
    parser.add_argument("--silent", action="store_true", help="never listen")
    parser.add_argument("--die-after", type=int, default=None, help="exit after this many completions")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds per completion")
    parser.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    parser.add_argument("--budget", default=None, help="the setting it was started with (echoed)")
    options = parser.parse_args()
    print(f"fake engine pid {os.getpid()} port {options.port} budget {options.budget}", flush=True)
    if options.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if options.exit_at_once is not None:
        print("error: cannot load the model (a test's refusal)", flush=True)
        sys.exit(options.exit_at_once)
    if options.silent:
        while True:
            time.sleep(60)
    served = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                seen = self.headers.get("Authorization")
                self.reply({"object": "list", "data": [{"id": options.model, "authorization": seen}]})
            elif self.path == "/version":
                self.reply({"version": "fake-1.0"})
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            time.sleep(options.slow)
            with lock:
                served[0] += 1
                if options.die_after is not None and served[0] > options.die_after:
                    print("fake engine: dying mid-run", flush=True)
                    os._exit(3)
            choices = [
                {"index": i, "text": answer(p), "finish_reason": "stop"} for i, p in enumerate(prompts)
            ]
            self.reply({"object": "text_completion", "model": options.model, "choices": choices})

        def log_message(self, format: str, *args: object) -> None:
            print(format % args, flush=True)

    ThreadingHTTPServer(("127.0.0.1", options.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
