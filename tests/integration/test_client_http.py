"""The client's own HTTP/1.1 connections (okq/httpconn.py) against a scripted
server on loopback: how replies are read (split, chunked, a reply that closes),
when a connection is used again, and what each failure becomes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest
from pydantic import BaseModel

from okq import httpconn
from okq.client import Client
from okq.errors import OkqError, Overloaded, Unavailable
from okq.retrying import NO_RETRIES


class Echo(BaseModel):
    n: int


def reply(status: int, body: object, *, headers: str = "", chunked: bool = False) -> bytes:
    data = msgpack.packb(body)
    if chunked:
        mid = len(data) // 2
        payload = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (data[:mid], data[mid:]))
        return (f"HTTP/1.1 {status} X\r\nContent-Type: application/msgpack\r\n{headers}"
                "Transfer-Encoding: chunked\r\n\r\n").encode() + payload + b"0\r\n\r\n"
    return (f"HTTP/1.1 {status} X\r\nContent-Type: application/msgpack\r\n{headers}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


class Scripted:
    """A server that reads each request whole and answers it with ``answer(request
    number, its head, its body)``: bytes to send (then keeps the connection), or
    None to close it without a word."""

    def __init__(self, answer: Callable[[int, bytes, bytes], bytes | None],
                 split: bool = False) -> None:
        self.answer, self.split = answer, split
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.open = 0
        self.most_open = 0
        self.delay = 0.0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    first = await reader.readexactly(1)
                    if first == b"\x16":  # a TLS handshake (the client's probe): hang up
                        return
                    head = first + await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                await asyncio.sleep(self.delay)
                out = self.answer(len(self.requests), head, body)
                if out is None:
                    return
                if self.split:  # a byte at a time
                    for k in range(len(out)):
                        writer.write(out[k:k + 1])
                        await writer.drain()
                else:
                    writer.write(out)
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()


@contextlib.asynccontextmanager
async def scripted(answer: Callable[[int, bytes, bytes], bytes | None],
                   split: bool = False) -> AsyncIterator[tuple[Scripted, str]]:
    server = Scripted(answer, split)
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        listening.close()


def echo(n: int, head: bytes, body: bytes) -> bytes:
    return reply(200, {"n": n})


async def test_calls_share_one_kept_alive_connection_and_send_a_whole_head() -> None:
    async with scripted(echo) as (server, url), Client(url, api_key="k-1", namespace="ns") as c:
        got = [(await c.call("queue.stats", {"queue_name": "q"}, Echo)).n for _ in range(3)]
        assert got == [1, 2, 3]
        assert server.connections == 1
        head, body = server.requests[0]
        lines = head.decode().split("\r\n")
        assert lines[0] == "POST /v1/queue.stats HTTP/1.1"
        assert f"Host: {url.removeprefix('http://')}" in lines
        assert "Authorization: Bearer k-1" in lines and "X-Okq-Namespace: ns" in lines
        assert "Content-Type: application/msgpack" in lines
        assert msgpack.unpackb(body) == {"queue_name": "q"}


async def test_a_path_under_the_url_is_kept() -> None:
    async with scripted(echo) as (server, url), Client(url + "/okq/") as c:
        await c.call("queue.stats", {}, Echo)
        assert server.requests[0][0].startswith(b"POST /okq/v1/queue.stats HTTP/1.1\r\n")


@pytest.mark.parametrize("how", ["split", "chunked"])
async def test_a_reply_split_or_chunked_is_read_whole(how: str) -> None:
    def answer(n: int, head: bytes, body: bytes) -> bytes:
        return reply(200, {"n": 1000 + n}, chunked=how == "chunked")

    async with scripted(answer, split=how == "split") as (server, url), Client(url) as c:
        assert (await c.call("queue.stats", {}, Echo)).n == 1001
        assert (await c.call("queue.stats", {}, Echo)).n == 1002
        assert server.connections == 1


async def test_connection_close_is_honoured() -> None:
    def answer(n: int, head: bytes, body: bytes) -> bytes:
        return reply(200, {"n": n}, headers="Connection: close\r\n")

    async with scripted(answer) as (server, url), Client(url) as c:
        for _ in range(3):
            await c.call("queue.stats", {}, Echo)
        assert server.connections == 3


async def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    def answer(n: int, head: bytes, body: bytes) -> bytes | None:
        return reply(200, {"n": n})

    async with scripted(answer) as (server, url), Client(url, backoff=NO_RETRIES) as c:
        await c.call("queue.stats", {}, Echo)
        assert c._pool is not None
        for conn in c._pool[1]._idle:  # as a node closes a keep-alive connection it timed out
            assert conn.transport is not None
            conn.transport.close()
        await asyncio.sleep(0.05)
        assert (await c.call("queue.stats", {}, Echo)).n == 2
        assert server.connections == 2


async def test_a_server_that_hangs_up_is_no_answer_and_the_connection_is_dropped() -> None:
    def answer(n: int, head: bytes, body: bytes) -> bytes | None:
        return None if n == 1 else reply(200, {"n": n})

    async with scripted(answer) as (server, url), Client(url, backoff=NO_RETRIES) as c:
        with pytest.raises(Unavailable, match="no answer from okq at") as caught:
            await c.call("queue.stats", {}, Echo)
        assert caught.value.details.get("sent") is not False  # it may have acted
        assert (await c.call("queue.stats", {}, Echo)).n == 2
        # the first; the TLS probe of a server that hung up without a word
        # (Client._speaks_tls); a new one for the second call
        assert server.connections == 3


async def test_a_reply_cut_short_is_no_answer() -> None:
    def answer(n: int, head: bytes, body: bytes) -> bytes | None:
        whole = reply(200, {"n": n})
        return whole[:-3] if n == 1 else whole

    async with scripted(answer) as (server, url), Client(url, timeout=0.5,
                                                          backoff=NO_RETRIES) as c:
        with pytest.raises(Unavailable, match="no answer from okq at"):
            await c.call("queue.stats", {}, Echo)
        assert (await c.call("queue.stats", {}, Echo)).n == 2
        assert server.connections == 2  # the cut one was closed, not reused out of step


async def test_a_refused_connection_says_nothing_was_sent() -> None:
    async with scripted(echo) as (_, url):
        pass  # closed: nothing listens there now
    async with Client(url, backoff=NO_RETRIES) as c:
        with pytest.raises(Unavailable, match="cannot reach okq at") as caught:
            await c.call("queue.stats", {}, Echo)
        assert caught.value.details.get("sent") is False


async def test_a_node_that_does_not_answer_times_out() -> None:
    async with scripted(echo) as (server, url), Client(url, timeout=0.3,
                                                        backoff=NO_RETRIES) as c:
        server.delay = 1
        with pytest.raises(Unavailable, match=r"no answer from okq at .*TimeoutError"):
            await c.call("queue.stats", {}, Echo)
        server.delay = 0
        # The late reply to the first call must not answer the second: a new connection.
        assert (await c.call("queue.stats", {}, Echo)).n == 2
        assert server.connections == 2


async def test_errors_and_retry_after_come_through() -> None:
    def answer(n: int, head: bytes, body: bytes) -> bytes:
        return reply(429, {"code": "overloaded", "message": "busy", "details": {}},
                     headers="Retry-After: 7\r\n")

    async with scripted(answer) as (_, url), Client(url, backoff=NO_RETRIES) as c:
        with pytest.raises(Overloaded) as caught:
            await c.call("queue.stats", {}, Echo)
        assert caught.value.retry_after == 7.0


async def test_not_http_is_no_answer_rather_than_a_crash() -> None:
    async with scripted(lambda n, head, body: b"SSH-2.0-OpenSSH\r\n\r\n") as (_, url), \
            Client(url, backoff=NO_RETRIES) as c:
        with pytest.raises(Unavailable, match=r"no answer from okq at .*not HTTP"):
            await c.call("queue.stats", {}, Echo)


async def test_calls_past_the_limit_wait_for_a_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpconn, "LIMIT", 2)
    async with scripted(echo) as (server, url), Client(url) as c:
        server.delay = 0.05
        got = await asyncio.gather(*(c.call("queue.stats", {}, Echo) for _ in range(6)))
        assert len(got) == 6 and len(server.requests) == 6
        assert server.most_open == 2


async def test_a_url_that_is_not_http_is_refused() -> None:
    async with Client("ftp://127.0.0.1:1", backoff=NO_RETRIES) as c:
        with pytest.raises(OkqError, match=r"is not an http:// or https:// URL"):
            await c.call("queue.stats", {}, Echo)


def test_a_client_used_again_under_another_event_loop_connects_anew() -> None:
    """``asyncio.run`` twice with one client: the first loop's connections are gone."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = msgpack.packb({"n": 7})
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        c = Client(f"http://127.0.0.1:{server.server_address[1]}", backoff=NO_RETRIES)
        assert asyncio.run(c.call("queue.stats", {}, Echo)).n == 7
        assert asyncio.run(c.call("queue.stats", {}, Echo)).n == 7
        asyncio.run(c.close())
        # The first loop's connection could not be closed on its closed loop: its
        # transport goes with the garbage, warning as an unclosed one (as an aiohttp
        # session's would). Collected here, so that it warns nowhere else.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
    finally:
        server.shutdown()
        server.server_close()


async def test_closing_the_client_ends_a_call_in_flight() -> None:
    """As an aiohttp session's close did: no connection outlives its client."""
    async with scripted(echo) as (server, url):
        c = Client(url, backoff=NO_RETRIES)
        await c.call("queue.stats", {}, Echo)  # one idle connection
        server.delay = 5
        call = asyncio.create_task(c.call("queue.stats", {}, Echo))
        await asyncio.sleep(0.2)  # written, waiting for its reply
        await c.close()
        with pytest.raises(Unavailable, match="no answer from okq at"):
            await asyncio.wait_for(call, 2)
