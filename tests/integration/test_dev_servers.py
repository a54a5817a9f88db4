"""The development servers' own start-up (okq/dev/servers.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from okq.dev import servers
from okq.dev.nginx import NginxServer, nginx_binary
from okq.dev.servers import HOST, SeaweedServer, ServerMissing, weed_binary


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process holds (listening) for the test's length."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_seaweedfs_starts_on_fresh_ports_when_one_was_taken_meanwhile(
        taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports are free when chosen and may be taken before weed binds them (another
    test's server, on a busy machine): the start is tried again on fresh ones."""
    try:
        weed_binary()
    except ServerMissing as exc:
        pytest.skip(str(exc))
    real = servers.free_port_pairs
    chosen: list[list[int]] = []

    def first_one_taken(count: int) -> list[int]:
        ports = real(count)
        if not chosen:
            ports[0] = taken_port  # the master's port, bound by someone else
        chosen.append(ports)
        return ports

    monkeypatch.setattr(servers, "free_port_pairs", first_one_taken)
    weed = SeaweedServer("okq", 60).start()
    try:
        assert len(chosen) == 2, chosen
        assert weed.ports["master"] != taken_port
    finally:
        weed.stop()


def test_nginx_turns_to_nodes_back_up_while_every_one_is_left_out(tmp_path: Path) -> None:
    """A rolling restart faster than ``fail_timeout`` leaves every node out of
    nginx's rotation while they are back up: nginx must try them all the same
    rather than answer "no live upstreams" until the first ``fail_timeout`` ends."""
    try:
        nginx_binary()
    except ServerMissing as exc:
        pytest.skip(str(exc))
    nodes = [servers.free_port() for _ in range(3)]
    with NginxServer(tmp_path, servers.free_port(), [f"{HOST}:{p}" for p in nodes]) as nginx:
        url = f"http://{HOST}:{nginx.port}/v1/queue.stats"
        # Every node refuses: each is left out for 10 s after this call.
        assert servers.http_status("POST", url, b"{}") == 502
        with _answering(nodes[1]):
            assert [servers.http_status("POST", url, b"{}") for _ in range(3)] == [200] * 3
    assert "upstream server temporarily disabled" in (tmp_path / "error.log").read_text()


@contextmanager
def _answering(port: int) -> Iterator[None]:
    """A plain HTTP server on ``port`` answering 200 to every POST, in a thread."""
    class Ok(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((HOST, port), Ok)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
