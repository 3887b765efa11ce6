"""The client's kept connections (ledgerdash_client.httpconn) against a real HTTP/1.1
server on loopback that counts the connections it accepted."""

from __future__ import annotations

import json
import multiprocessing
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ledgerdash_client import httpconn
from ledgerdash_client.httpconn import Connections, MaybeSent, NotSent
from tests.live import free_port

#: tcpi_state of a socket TCP has closed (include/net/tcp_states.h)
TCP_CLOSE = 7


class KeepAliveServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.connections = 0
        self.requests: list[str] = []
        #: what to do after answering the next request: "", "close" (send FIN, keep
        #: reading: a request sent then would get no answer) or "reset" (RST)
        self.then = ""
        self.done = threading.Event()
        #: read the next request, then close without answering it
        self.drop_next = False

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        self.connections += 1
        return sock, address

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/v1"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps the connection open unless told otherwise
    server: KeepAliveServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append(body.decode())
        if self.server.drop_next:
            self.server.drop_next = False
            self.close_connection = True
            return
        raw = json.dumps({"seen": len(self.server.requests)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)
        self.wfile.flush()
        then, self.server.then = self.server.then, ""
        if then == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif then == "close":
            self.connection.shutdown(socket.SHUT_WR)
            self.server.done.wait(60)
        if then:
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[KeepAliveServer]:
    running = KeepAliveServer()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.done.set()
        running.shutdown()
        running.server_close()


def post(connections: Connections, url: str, body: str) -> dict[str, Any]:
    answer = connections.request(
        "POST", url + "/attempts", body=body.encode(), headers={"Content-Type": "application/json"}, timeout=5
    )
    assert answer.status == 200
    return dict(json.loads(answer.body))


def wait_until_readable(connections: Connections) -> None:
    """Until the client's kept socket has something to read (the server's FIN or RST arrived)."""
    held = connections._local.held
    assert held is not None
    assert held.conn.sock is not None
    ready, _, _ = select.select([held.conn.sock], [], [], 30)
    assert ready, "the server's close never reached the client"


def wait_until_reset(connections: Connections) -> None:
    """Until the server's RST reached the client's kept socket, which TCP
    then closes (Linux's TCP_INFO state). The server half-closes (FIN)
    before its close sends the RST, so a socket is readable, at its end of
    stream, while the reset may still be on its way."""
    held = connections._local.held
    assert held is not None
    sock = held.conn.sock
    assert sock is not None
    for _ in range(3000):
        if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE:
            return
        time.sleep(0.01)
    raise AssertionError("the server's reset never reached the client")


def test_requests_in_a_row_share_one_connection(server: KeepAliveServer) -> None:
    connections = Connections(server.url, reuse_within=60)
    for i in range(5):
        assert post(connections, server.url, f"r{i}")["seen"] == i + 1
    assert server.connections == 1


def test_a_connection_idle_past_the_bound_is_not_reused(server: KeepAliveServer) -> None:
    connections = Connections(server.url, reuse_within=0)  # every idle connection is too old
    post(connections, server.url, "a")
    post(connections, server.url, "b")
    assert server.connections == 2
    assert server.requests == ["a", "b"]


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_connection_the_server_closed_while_idle_is_replaced(server: KeepAliveServer, how: str) -> None:
    connections = Connections(server.url, reuse_within=60)
    server.then = how
    post(connections, server.url, "first")
    wait_until_readable(connections)
    assert post(connections, server.url, "second")["seen"] == 2
    assert server.connections == 2
    assert server.requests == ["first", "second"]  # each sent once


def test_a_request_that_could_not_be_sent_on_a_kept_connection_goes_on_a_new_one(
    server: KeepAliveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    connections = Connections(server.url, reuse_within=60)
    server.then = "reset"
    post(connections, server.url, "first")
    wait_until_reset(connections)
    # As if the reset had not arrived yet when the client looked: sending on the socket fails.
    monkeypatch.setattr(httpconn, "_readable", lambda sock: False)
    assert post(connections, server.url, "second")["seen"] == 2
    assert server.requests == ["first", "second"]
    assert server.connections == 2


def test_a_request_sent_without_an_answer_may_have_landed(server: KeepAliveServer) -> None:
    connections = Connections(server.url, reuse_within=60)
    post(connections, server.url, "first")
    server.drop_next = True
    with pytest.raises(MaybeSent):
        connections.request("POST", server.url + "/attempts", body=b"second", headers={}, timeout=5)
    assert server.requests == ["first", "second"]  # it did arrive: nothing may send it again


def test_a_refused_connection_was_not_sent() -> None:
    url = f"http://127.0.0.1:{free_port()}/api/v1"
    with pytest.raises(NotSent):
        Connections(url).request("POST", url + "/attempts", body=b"x", headers={}, timeout=5)


def _child_posts(url: str, out: Any) -> None:
    out.send(post(CONNECTIONS, url, "child")["seen"])


CONNECTIONS: Connections


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_forked_process_opens_its_own_connection(server: KeepAliveServer) -> None:
    global CONNECTIONS
    CONNECTIONS = Connections(server.url, reuse_within=60)
    post(CONNECTIONS, server.url, "parent")
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child_posts, args=(server.url, send))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert receive.recv() == 2
    post(CONNECTIONS, server.url, "parent again")  # its own connection, untouched by the child
    assert server.connections == 2
    assert server.requests == ["parent", "child", "parent again"]


def test_behind_a_proxy_requests_go_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(self.path)  # a proxy is sent the whole URL
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        url = "http://ledger.invalid:8000/api/v1"
        answer = Connections(url).request("POST", url + "/attempts", body=b"{}", headers={}, timeout=5)
        assert answer.status == 200
        assert seen == ["http://ledger.invalid:8000/api/v1/attempts"]
    finally:
        proxy.shutdown()
        proxy.server_close()
