"""A real HTTP receiver for notification tests: verifies webhook signatures
as a tenant's receiver would, and can be told to fail or hang.

Run in a thread (:class:`Receiver`) or as its own process
(``python -m tests.notify_receiver PORT SECRET LOGFILE``: one JSON line per
request it accepted, written before it answers).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ledgerdash.notify import signing


class Receiver:
    def __init__(self, secret: str = "", log_path: str | None = None) -> None:
        self.secret = secret
        self.mode = "ok"  # ok | fail | hang
        self.hang_seconds = 5.0
        self.received: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.log_path = log_path
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # readiness
                self.send_response(200)
                self.end_headers()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.handle(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        if self.mode == "hang":
            time.sleep(self.hang_seconds)
        elif self.mode == "fail":
            request.send_response(503)
            request.end_headers()
            request.wfile.write(b"try later")
            return
        signature = request.headers.get(signing.SIGNATURE_HEADER)
        if self.secret and signature is not None:
            try:
                signing.verify(
                    self.secret,
                    timestamp=request.headers.get(signing.TIMESTAMP_HEADER, ""),
                    body=body,
                    signature=signature,
                    now=time.time(),
                )
            except signing.SignatureError as exc:
                with self._lock:
                    self.refused.append(str(exc))
                request.send_response(401)
                request.end_headers()
                return
        entry = {
            "delivery": request.headers.get(signing.DELIVERY_HEADER),
            "signed": signature is not None,
            "body": json.loads(body),
        }
        with self._lock:
            self.received.append(entry)
            if self.log_path:
                with open(self.log_path, "a") as log:
                    log.write(json.dumps(entry) + "\n")
        request.send_response(204)
        request.end_headers()


if __name__ == "__main__":
    port, secret, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    receiver = Receiver(secret, path)
    if len(sys.argv) > 4:  # a slow receiver: every request takes this long
        receiver.mode, receiver.hang_seconds = "hang", float(sys.argv[4])
    receiver.server.server_close()
    receiver.server = ThreadingHTTPServer(("127.0.0.1", port), receiver.server.RequestHandlerClass)
    receiver.server.serve_forever()
