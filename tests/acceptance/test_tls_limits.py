"""TLS on the node's listener, and the limits that keep one client from exhausting
a node, against real ``okq serve`` processes.

- **TLS**: a self-signed certificate for 127.0.0.1, made here with ``cryptography``;
  the Python client and the CLI trusting it talk HTTPS to the node, while plain
  HTTP to the same port and clients that do not trust it fail.
- **Connections**: past ``--max-connections`` a new connection is answered 503 and
  closed; the node serves again once connections close.
- **Slow clients**: past ``--request-read-timeout`` a client that has not sent its
  request is cut off, while a long poll on the same node waits as long as it asks.
- **Headers and bodies**: over ``--max-header-bytes`` a 4xx, never a 5xx; over
  ``--max-body-bytes`` a 413.

Limits are checked on raw sockets, so what is measured is what the node sends,
not what a client library makes of it.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from http.client import HTTPException, HTTPResponse
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from okq.client import Client
from okq.errors import OkqError
from okq.retrying import retryable
from tests.nodes import KEYS, Node, free_port, okq_node

_SCRIPT = Path(sys.executable).with_name("okq")
OKQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "okq.cli"]
HEADER_LIMIT = 1024  # --max-header-bytes (its minimum)
BODY_LIMIT = 4096  # --max-body-bytes
READ_TIMEOUT = 1.0  # --request-read-timeout
CUT_WITHIN = 3.0  # seconds by which a slow client must be cut off


# -- TLS ----------------------------------------------------------------------------------


def self_signed(tmp: Path, name: str = "cert") -> tuple[Path, Path]:
    """(certificate, key) PEM files of a self-signed certificate for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"okq test {name}")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@contextmanager
def tls_node(tmp: Path, cert: Path, key: Path) -> Iterator[Node]:
    """``okq serve --tls-cert --tls-key`` on a free port, up once /health answers
    over HTTPS (tests.nodes.okq_node waits on plain HTTP)."""
    port = free_port()
    log = tmp / f"tls-node-{port}.log"
    args = [sys.executable, "-m", "okq.cli", "serve", "--store", f"file://{tmp / 'store'}",
            "--port", str(port), "--log-level", "WARNING", "--tls-cert", str(cert),
            "--tls-key", str(key)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OKQ_SIGNING_KEYS": KEYS})
    node = Node(proc, f"https://127.0.0.1:{port}", log)
    try:
        _wait_https(node, ssl.create_default_context(cafile=str(cert)))
        yield node
    finally:
        node.stop()


def _wait_https(node: Node, context: ssl.SSLContext, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"okq serve exited:\n{node.output()}")
        try:
            with urllib.request.urlopen(f"{node.url}/health", timeout=1,
                                        context=context) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    node.stop(signal.SIGKILL)
    raise RuntimeError(f"okq serve did not answer over HTTPS:\n{node.output()}")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Path]]:
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(tmp)
    with tls_node(tmp, cert, key) as node:
        yield node, cert
    assert "Traceback" not in node.output(), node.output()[-4000:]


async def test_the_client_trusting_the_certificate_works_over_https(
        tls: tuple[Node, Path]) -> None:
    node, cert = tls
    assert node.url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=str(cert))
    async with Client(node.url, ssl=context) as c:
        await c.create_queue("secure")
        ids = await c.produce("secure", ["over tls", b"\x00binary"])
        leased = await c.lease("secure", 2)
        assert sorted(i.id for i in leased) == sorted(ids)
        assert {i.utf8 for i in leased} >= {"over tls"}
        assert await c.complete("secure", [i.token for i in leased]) == 2
        assert (await c.stats("secure")).completed == 2


def test_plain_http_to_the_tls_port_fails(tls: tuple[Node, Path]) -> None:
    node, _ = tls
    plain = node.url.replace("https://", "http://")
    with pytest.raises((OSError, HTTPException)):
        with urllib.request.urlopen(f"{plain}/health", timeout=10) as resp:
            resp.read()
    assert node.proc.poll() is None


async def test_an_http_url_to_the_tls_port_is_told_to_use_https(tls: tuple[Node, Path]) -> None:
    """Not "Server disconnected", retried five times: the client finds that the port
    speaks TLS and says so at once, and the CLI passes it on."""
    node, _ = tls
    plain = node.url.replace("https://", "http://")
    async with Client(plain) as c:
        began = time.monotonic()
        with pytest.raises(OkqError) as err:
            await c.stats("q")
    assert f"seems to speak TLS; use {node.url}" in err.value.message, err.value
    assert not retryable(err.value) and time.monotonic() - began < 5
    run = subprocess.run([*OKQ, "--url", plain, "stats", "q"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert (run.returncode, run.stdout) == (1, ""), run
    assert run.stderr.startswith("error: ") and f"use {node.url}" in run.stderr, run.stderr
    assert node.proc.poll() is None


async def test_clients_that_do_not_trust_the_certificate_fail(
        tls: tuple[Node, Path], tmp_path: Path) -> None:
    node, _ = tls
    other, _ = self_signed(tmp_path, "other")
    for context in (None, ssl.create_default_context(cafile=str(other))):
        async with Client(node.url, ssl=context) as c:
            # not a failure that waiting outlasts: neither retried nor waited out
            with pytest.raises(OkqError, match="certificate verify failed") as err:
                await c.list_queues()
            assert not retryable(err.value)
    with pytest.raises(urllib.error.URLError, match="certificate verify failed"):
        with urllib.request.urlopen(f"{node.url}/health", timeout=10,
                                    context=ssl.create_default_context()):
            pass


def test_the_cli_with_ca_file_works(tls: tuple[Node, Path]) -> None:
    node, cert = tls

    def okq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*OKQ, "--url", node.url, *args], capture_output=True,
                              text=True, timeout=60, check=False)

    trusted = ["--ca-file", str(cert)]
    with urllib.request.urlopen(urllib.request.Request(
            f"{node.url}/v1/queues.create", data=b'{"name": "cli-tls"}',
            headers={"Content-Type": "application/json"}),
            context=ssl.create_default_context(cafile=str(cert)), timeout=10) as resp:
        assert resp.status == 201
    produced = okq(*trusted, "produce", "cli-tls", "one", "two")
    assert produced.returncode == 0, produced.stderr
    stats = okq(*trusted, "-o", "json", "stats", "cli-tls")
    assert stats.returncode == 0, stats
    assert [(q["queue_name"], q["available"]) for q in json.loads(stats.stdout)] == [
        ("cli-tls", 2)], stats.stdout
    untrusted = okq("-o", "json", "stats", "cli-tls")
    assert untrusted.returncode != 0 and "certificate verify failed" in untrusted.stderr, (
        untrusted)
    assert "Traceback" not in untrusted.stderr


# -- limits -------------------------------------------------------------------------------


def _port(node: Node) -> int:
    return int(node.url.rsplit(":", 1)[1])


def read_all(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything the node sends until it closes the connection (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def exchange(node: Node, raw: bytes, timeout: float = 10) -> bytes:
    """Send ``raw`` (with ``Connection: close``) on a new connection; the answer."""
    with socket.create_connection(("127.0.0.1", _port(node)), timeout=timeout) as sock:
        sock.sendall(raw)
        return read_all(sock, timeout)


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), answer[:200]
    return int(answer.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("limits")
    extra = ["--request-read-timeout", str(READ_TIMEOUT), "--max-header-bytes",
             str(HEADER_LIMIT), "--max-body-bytes", str(BODY_LIMIT)]
    with okq_node(f"file://{tmp / 'store'}", tmp, extra=extra) as node:
        yield node


class _Replay:
    """What a socket received, for ``http.client.HTTPResponse`` to parse."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def parse_answer(raw: bytes) -> tuple[int, bytes]:
    """(status, body) as an HTTP client reads them: by the answer's own framing."""
    response = HTTPResponse(_Replay(raw))  # type: ignore[arg-type]
    response.begin()
    with response:
        return response.status, response.read()


def _refused_connection(sock: socket.socket) -> bytes:
    """The answer of a connection past the limit: a 503 and the end of the stream,
    before anything was sent on it."""
    answer = read_all(sock, timeout=5)
    assert status_of(answer) == 503, answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "overloaded", answer
    return answer


def _health(node: Node) -> int:
    try:
        with urllib.request.urlopen(f"{node.url}/health", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node that takes 5 connections at most."""
    tmp = tmp_path_factory.mktemp("crowded")
    extra = ["--max-connections", "5", "--request-read-timeout", "30"]
    with okq_node(f"file://{tmp / 'store'}", tmp, extra=extra) as node:
        yield node
    assert "Traceback" not in node.output(), node.output()[-4000:]


def _fill(node: Node, stack: ExitStack, count: int) -> list[socket.socket]:
    """``count`` idle connections to ``node``, closed with ``stack``."""
    return [stack.enter_context(socket.create_connection(("127.0.0.1", _port(node))))
            for _ in range(count)]


def _wait_served(node: Node) -> None:
    deadline = time.monotonic() + 5
    while _health(node) != 200:
        assert time.monotonic() < deadline, "the node does not serve after connections closed"
        time.sleep(0.1)


def test_the_refusal_is_a_well_formed_http_answer(crowded: Node) -> None:
    """A client reads the 503 by its Content-Length: it must match the body."""
    _wait_served(crowded)
    with ExitStack() as stack:
        _fill(crowded, stack, 5)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", _port(crowded))) as sixth:
            raw = read_all(sixth, timeout=5)
    status, body = parse_answer(raw)
    assert status == 503 and json.loads(body)["code"] == "overloaded", raw


def test_connections_past_the_limit_get_503(crowded: Node) -> None:
    node = crowded
    _wait_served(node)
    with ExitStack() as stack:
        idle = _fill(node, stack, 5)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", _port(node))) as sixth:
            _refused_connection(sixth)
        assert _health(node) in (0, 503)  # still full: refused, or cut before a reply
        for sock in idle:
            sock.close()
        _wait_served(node)


def _accepted(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the node took (waits for a request), not refused (503)."""
    taken = 0
    for sock in socks:
        sock.settimeout(0.5)
        try:
            first = sock.recv(12, socket.MSG_PEEK)
        except TimeoutError:
            taken += 1
            continue
        assert first.startswith(b"HTTP/1.1 503"), first
    return taken


def test_a_burst_of_connections_stays_within_the_limit(crowded: Node) -> None:
    """3 connections open, then 20 at once: 2 more fit under the limit of 5."""
    _wait_served(crowded)
    with ExitStack() as stack:
        _fill(crowded, stack, 3)
        time.sleep(0.3)
        taken = _accepted(_fill(crowded, stack, 20))
    assert taken == 2, f"{3 + taken} connections open at once with --max-connections 5"


async def _half_request(node: Node, raw: bytes, trickle: float = 0.0) -> tuple[float, bytes]:
    """Send ``raw`` (a byte at a time every ``trickle`` s when set) and never the
    rest; seconds until the node closes the connection, and what it sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(node))
    began = time.monotonic()
    try:
        if trickle:
            for byte in raw:
                if reader.at_eof():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(trickle)
        else:
            writer.write(raw)
        data = await asyncio.wait_for(reader.read(), timeout=10)
    except ConnectionResetError:
        data = b""
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionResetError:
            pass
    return time.monotonic() - began, data


async def test_slow_clients_are_cut_off_and_long_polls_are_not(limited: Node) -> None:
    async with Client(limited.url) as c:
        await c.create_queue("slow-empty")
        await c.create_queue("slow-fed")
        began = time.monotonic()
        empty = asyncio.create_task(c.lease("slow-empty", 1, request_timeout=3))
        fed = asyncio.create_task(c.lease("slow-fed", 1, request_timeout=3))
        half_line, trickled = await asyncio.gather(
            _half_request(limited, b"POST /v1/queue.stats HTT"),
            _half_request(limited, b"POST /v1/queue.stats HTTP/1.1\r\nHost: x\r\n" * 4,
                          trickle=0.1))
        await asyncio.sleep(max(0.0, 2.5 - (time.monotonic() - began)))
        ids = await c.produce("slow-fed", ["worth the wait"])
        got = await fed
        waited_fed = time.monotonic() - began
        assert [i.id for i in got] == ids and waited_fed >= 2.4, waited_fed
        assert await empty == []
        waited = time.monotonic() - began
    for what, (seconds, data) in {"half a request line": half_line,
                                  "a trickled request": trickled}.items():
        assert seconds < CUT_WITHIN, f"{what}: still open after {seconds:.1f}s"
        assert not data.startswith(b"HTTP/1.1 2"), (what, data)
    assert 2.9 <= waited < 5, f"a 3 s long poll answered after {waited:.1f}s"


def test_a_slow_body_is_refused(limited: Node) -> None:
    with socket.create_connection(("127.0.0.1", _port(limited))) as sock:
        sock.sendall(b"POST /v1/queues.list HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        began = time.monotonic()
        answer = read_all(sock, timeout=10)
        seconds = time.monotonic() - began
    assert seconds < CUT_WITHIN, f"a slow body held the connection {seconds:.1f}s"
    status, body = parse_answer(answer)
    assert status == 408 and json.loads(body)["code"] == "request_timeout", answer


def _get(path: str, headers: list[bytes]) -> bytes:
    return b"\r\n".join([f"GET {path} HTTP/1.1".encode(), b"Host: x",
                         b"Connection: close", *headers, b"", b""])


@pytest.mark.parametrize("what", ["field", "request line", "header count"])
def test_oversized_headers_get_4xx(limited: Node, what: str) -> None:
    under = _get("/health", [b"X-Fits: " + b"a" * (HEADER_LIMIT - 100)])
    assert status_of(exchange(limited, under)) == 200  # the control: within the limit
    raw = {
        "field": _get("/health", [b"X-Big: " + b"a" * (HEADER_LIMIT * 2)]),
        "request line": _get("/health?" + "a" * (HEADER_LIMIT * 2), []),
        "header count": _get("/health", [f"X-N{n}: n".encode() for n in range(200)]),
    }[what]
    answer = exchange(limited, raw)
    assert status_of(answer) in (400, 414, 431), answer[:300]
    assert _health(limited) == 200


@pytest.fixture(scope="module")
def big_queue(limited: Node) -> str:
    req = urllib.request.Request(f"{limited.url}/v1/queues.create", data=b'{"name": "big"}',
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10):
        return "big"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_gets_413(limited: Node, big_queue: str, chunked: bool) -> None:
    over = json.dumps({"queue_name": big_queue, "items": [{"utf8": "x" * BODY_LIMIT}]})
    small = json.dumps({"queue_name": big_queue, "items": [{"utf8": "x"}]})
    for data, expected in ((small.encode(), 200), (over.encode(), 413)):
        framing = (b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(data):x}\r\n".encode()
                   + data + b"\r\n0\r\n\r\n") if chunked else \
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data
        answer = exchange(limited, b"POST /v1/queue.produce HTTP/1.1\r\nHost: x\r\n"
                          b"Connection: close\r\nContent-Type: application/json\r\n" + framing)
        assert status_of(answer) == expected, answer[:400]
        if expected == 413:
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "too_large"


def _server_errors(node: Node) -> list[str]:
    """The node's 5xx answers, as its metrics count them."""
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines()
            if line.startswith("okq_http_requests_total") and 'status="5' in line]


def test_a_client_gone_mid_body_is_not_an_internal_error(limited: Node) -> None:
    """A client that goes away while sending its body (or half-closes after it)
    is gone, not a fault of the node: no 500 counted, no internal error logged."""
    head = (b"POST /v1/queues.list HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n")
    for what, raw in (("half a body, then closed", head + b"{"),
                      ("a body, then half-closed", head + b"{}")):
        with socket.create_connection(("127.0.0.1", _port(limited))) as sock:
            sock.sendall(raw)
            time.sleep(0.2)
            sock.shutdown(socket.SHUT_WR)
            read_all(sock, timeout=5)
        time.sleep(0.3)
        assert "internal error" not in limited.output(), (what, limited.output()[-3000:])
        assert not _server_errors(limited), (what, _server_errors(limited))
