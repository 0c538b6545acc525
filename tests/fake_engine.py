"""A stand-in OpenAI-compatible engine for ``engine.serve``'s tests: ``python -m tests.fake_engine --port P``.

It answers ``GET /v1/models`` (its model, and the ``Authorization`` header it was sent: a server that
echoes a key), ``GET /version`` and ``POST /v1/completions`` deterministically (each prompt's last number
of three digits or more: a passkey task's needle). Flags make it fail as servers do: exit at once, never
answer, die after some completions, answer slowly, ignore SIGTERM; answer some completions with an HTTP
error (``--fail-status``, its body as llama.cpp and vLLM write theirs), refuse a model it does not serve
(vLLM's 404), report a prompt count (``usage.prompt_tokens``: below what was sent, a server that cut the
prompt). It prints its pid and port first. Standard library only.
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
    parser.add_argument("--fail-status", type=int, default=None, help="answer completions with this status")
    parser.add_argument("--fail-from", type=int, default=1, help="the first completion that fails")
    parser.add_argument("--fail-until", type=int, default=None, help="the last completion that fails")
    parser.add_argument("--reason", default="a test's failure", help="the failure's message")
    parser.add_argument("--strict-model", action="store_true", help="404 for a model it does not serve")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="the usage.prompt_tokens it reports")
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
        def reply(self, body: dict, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
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
                call = served[0]
                if options.die_after is not None and call > options.die_after:
                    print("fake engine: dying mid-run", flush=True)
                    os._exit(3)
            if options.strict_model and body.get("model") != options.model:  # as vLLM answers
                message = f"The model `{body.get('model')}` does not exist."
                self.reply({"object": "error", "message": message, "code": 404}, 404)
                return
            last = options.fail_until if options.fail_until is not None else call
            if options.fail_status is not None and options.fail_from <= call <= last:
                print(f"fake engine: completion {call} fails with {options.fail_status}", flush=True)
                error = {"message": options.reason, "code": options.fail_status}
                self.reply({"error": error}, options.fail_status)
                return
            choices = [
                {"index": i, "text": answer(p), "finish_reason": "stop"} for i, p in enumerate(prompts)
            ]
            reply = {"object": "text_completion", "model": options.model, "choices": choices}
            if options.prompt_tokens is not None:
                reply["usage"] = {"prompt_tokens": options.prompt_tokens, "completion_tokens": 1}
            self.reply(reply)

        def log_message(self, format: str, *args: object) -> None:
            print(format % args, flush=True)

    ThreadingHTTPServer(("127.0.0.1", options.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
