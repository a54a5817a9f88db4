"""The client's HTTP/1.1 connections to one node (or the load balancer in front).

``okq.client.Client`` POSTs every call here unless it was given an aiohttp
session of its own: keep-alive connections (up to ``LIMIT`` at once, an idle one
kept ``IDLE_SECONDS``, as aiohttp's connector does), each an asyncio protocol
whose replies httptools (llhttp, the parser aiohttp's own C parser wraps) reads.
A call writes its head and body at once and waits for one reply: about a third
of the client's CPU per leased and completed message went to aiohttp's request
and response objects, timers and header maps, which okq's calls do not use
(docs/PERFORMANCE.md, "Ninth round").

What can go wrong, as the client tells it apart:

* :class:`ConnectFailed`: no connection was made, so nothing was sent;
* :class:`TlsFailed`: the TLS handshake failed (nothing was sent either);
* :class:`Hangup`: the connection broke or closed, or the reply could not be
  parsed, after the request was written: the node may have acted on it.

A timeout is the caller's (``asyncio.timeout`` around :meth:`Pool.post`); a
connection whose call was cancelled or timed out is closed, never reused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

import httptools

__all__ = ["IDLE_SECONDS", "LIMIT", "ConnectFailed", "Hangup", "Pool", "Reply", "TlsFailed"]

#: Connections open at once to one node; calls beyond wait for one.
LIMIT = 100
#: An idle connection older than this is closed rather than used again.
IDLE_SECONDS = 15.0
#: How long making a connection may take (aiohttp's sock_connect, as the client had).
CONNECT_SECONDS = 10.0


class ConnectFailed(Exception):
    """No connection: nothing was sent."""


class TlsFailed(Exception):
    """The TLS handshake failed: nothing was sent."""


class Hangup(Exception):
    """No whole reply after the request was written; ``answered``: some of a reply
    had come (so the server spoke HTTP)."""

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class Reply:
    __slots__ = ("body", "retry_after", "status")

    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        self.status, self.body, self.retry_after = status, body, retry_after


class _Connection(asyncio.Protocol):
    """One connection: at most one call on it at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[Reply, bool]] | None = None
        self.body: list[bytes] = []
        self.retry_after: str | None = None
        self.answered = False
        self.lost = False
        self.idle_since = 0.0

    # -- asyncio's calls -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Hangup(f"a reply that is not HTTP: {exc}", True))
            self.close()

    def eof_received(self) -> bool:
        return False  # close: a reply ends by its length, never by the connection's end

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        why = f"the connection broke: {exc}" if exc else "the server closed the connection"
        self._fail(Hangup(why, self.answered))

    # -- httptools' calls ----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        reply = Reply(self.parser.get_status_code(),
                      self.body[0] if len(self.body) == 1 else b"".join(self.body),
                      self.retry_after)
        keep = self.parser.should_keep_alive()
        self.body, self.retry_after, self.answered = [], None, False
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((reply, keep))
        else:  # a reply nobody asked for: the connection is out of step
            self.close()

    # -- ours ------------------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        """Closed at once: ``abort``, not ``close``. A TLS connection's ``close`` first
        exchanges close_notify with the server, over further turns of the loop: a
        client closed just before its loop ended left the socket open (HTTP's framing
        does not need close_notify, and nothing is left to send on a dropped one)."""
        self.lost = True
        if self.transport is not None:
            try:
                self.transport.abort()
            except RuntimeError:  # its event loop is closed: the socket goes with the transport
                pass


class Pool:
    """Keep-alive connections to ``host:port`` (TLS with ``tls``)."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self.host, self.port, self.tls = host, port, tls
        #: Its connections and its semaphore belong to the loop it was made on.
        self.loop = asyncio.get_running_loop()
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()  # idle or in use: what close() closes
        self._slots = asyncio.Semaphore(LIMIT)
        self._closed = False

    async def post(self, target: bytes, head: bytes, body: bytes) -> Reply:
        """POST ``body`` to ``target`` (the path), ``head`` being the header lines
        after the request line (each ending in CRLF, Content-Length not among them)."""
        async with self._slots:
            conn = self._take()
            if conn is None:
                conn = await self._connect()
            assert conn.transport is not None
            waiter: asyncio.Future[tuple[Reply, bool]] = self.loop.create_future()
            conn.waiter = waiter
            try:
                conn.transport.writelines([
                    b"POST ", target, b" HTTP/1.1\r\n", head,
                    b"Content-Length: %d\r\n\r\n" % len(body), body])
                reply, keep = await waiter
            except BaseException:
                self._drop(conn)  # cancelled, timed out or broken: its reply may still come
                raise
            if keep and not conn.lost and not self._closed:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                self._drop(conn)
            return reply

    def _take(self) -> _Connection | None:
        """The most recently used idle connection still open and not too old."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.lost and time.monotonic() - conn.idle_since < IDLE_SECONDS:
                return conn
            self._drop(conn)
        return None

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        extra: dict[str, Any] = {}
        if self.tls is not None:
            extra = {"ssl": self.tls, "server_hostname": self.host}
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                _, conn = await loop.create_connection(_Connection, self.host, self.port,
                                                       **extra)
        except ssl.SSLError as exc:  # an OSError too: TLS's own first
            raise TlsFailed(str(exc)) from exc
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        if self._closed:  # closed while this one was being made
            conn.close()
            raise ConnectFailed("the client was closed")
        self._open.add(conn)
        return conn

    def close(self) -> None:
        """Close every connection, idle or in use (a call in flight then fails as one
        whose connection broke)."""
        self._closed = True
        self._idle.clear()
        while self._open:
            self._open.pop().close()
