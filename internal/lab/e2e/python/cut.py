"""End-to-end check of a stream cut mid-body, with the official openai Python client.

Two roles, one file:

  cut.py replica PORT   a fake OpenAI replica on 127.0.0.1:PORT whose chat
                        streams send two events and then nothing, until the
                        router closes the connection (its upstream idle
                        timeout); /v1/models and /metrics answer the
                        router's health checks.
  cut.py                the check, against the router at KVMESH_URL (in front
                        of that replica, directly or over a hop): the stream
                        yields the two chunks, then the client raises
                        openai.APIError from the router's error event, not
                        the APIConnectionError (or, in older clients, the
                        httpx.RemoteProtocolError) of a cut connection, within
                        KVMESH_CUT_BOUND seconds of the last chunk.

Environment: KVMESH_URL (required for the check), KVMESH_MODEL (default
kvmesh-sim), KVMESH_CUT_BOUND (default 20). Exits non-zero with a message on
failure.
"""

import json
import os
import select
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = os.environ.get("KVMESH_MODEL", "kvmesh-sim")


class StallingReplica(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: the harness shows logs on failure only
        pass

    def _send(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        elif self.path == "/metrics":
            self._send(200, "text/plain", b"# no engine metrics\n")
        else:
            self._send(404, "text/plain", b"not found\n")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/chat/completions":
            self._send(404, "text/plain", b"not found\n")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(2):
            chunk = {"id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                     "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}]}
            ev = f"data: {json.dumps(chunk)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            self.wfile.flush()
        # Stall until the router gives up and closes the connection (a
        # read then finds its end), for at most a minute.
        readable, _, _ = select.select([self.connection], [], [], 60)
        if readable:
            self.connection.recv(1)
        self.close_connection = True


def serve(port):
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), StallingReplica).serve_forever()


def check():
    import openai
    from openai import OpenAI

    base = os.environ.get("KVMESH_URL")
    if not base:
        print("cut.py: KVMESH_URL is not set", file=sys.stderr)
        sys.exit(2)
    bound = float(os.environ.get("KVMESH_CUT_BOUND", "20"))
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
    got, last = [], None
    t0 = time.monotonic()
    try:
        stream = client.chat.completions.create(model=MODEL, stream=True, messages=[{"role": "user", "content": "Tell me a story."}])
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
            last = time.monotonic()
    except openai.APIError as e:
        took = time.monotonic() - (last or t0)
        problems = []
        if type(e) is not openai.APIError:
            problems.append(f"raised {type(e).__name__}, want APIError from the error event")
        if got != ["t0", "t1"]:
            problems.append(f"chunks {got}, want ['t0', 't1']")
        if not isinstance(e.body, dict) or e.body.get("code") != "upstream_timeout" or not e.message:
            problems.append(f"error body {e.body!r}, want the router's upstream_timeout error")
        if took > bound:
            problems.append(f"raised {took:.1f}s after the last chunk, over {bound}s")
        if problems:
            print(f"FAIL cut stream against {base}: " + "; ".join(problems), file=sys.stderr)
            sys.exit(1)
        print(f"ok   cut stream raises APIError ({e.message!r}) {took * 1000:.0f} ms after the last chunk")
        return
    except Exception:  # noqa: BLE001 - any other error fails the check
        print(f"FAIL cut stream against {base}: not an APIError:\n{traceback.format_exc()}", file=sys.stderr)
        sys.exit(1)
    print(f"FAIL cut stream against {base}: the stream ended without an error after {got}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "replica":
        serve(int(sys.argv[2]))
    else:
        check()
