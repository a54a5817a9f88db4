"""The node's listening socket: TLS, and the limits that keep one client from
exhausting a node.

- **Connections**: past ``--max-connections`` open connections, a new one is
  answered ``503`` and closed at once, before anything is read from it.
- **Slow clients**: a connection that has not finished a request within
  ``--request-read-timeout`` seconds (a client trickling its headers, or an idle
  keep-alive connection) is closed. A request being handled is never cut: a long
  poll waits on the node, not on the client. A body must arrive within the same
  time (``okq.server.codec.read_body``).
- **Headers**: request lines and header fields over ``--max-header-bytes`` are
  refused (400, aiohttp's parser), as are more than 128 header fields; the node logs
  them at debug level, not as errors (``okq.cli``'s filter).
- **Bodies**: over ``--max-body-bytes``, 413.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import access_logger

from okq.settings import Settings

_REFUSED_BODY = (b'{"code": "overloaded", "message": "too many open connections to this node", '
                 b'"details": {}}')
_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nRetry-After: 1\r\n"
            b"Content-Length: " + str(len(_REFUSED_BODY)).encode() + b"\r\n\r\n" + _REFUSED_BODY)


class _Refuse(asyncio.Protocol):
    """One connection too many: a 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's: typed, not checked
        writer = cast(asyncio.WriteTransport, transport)
        writer.write(_REFUSED)
        writer.close()


class _Open:
    """Connections accepted and not yet closed, counted as the factory makes them:
    asyncio accepts a burst of sockets before any of their ``connection_made`` runs,
    so aiohttp's own list would let a burst past the limit."""

    def __init__(self) -> None:
        self.n = 0


class _Guarded(web.RequestHandler):
    """aiohttp's connection handler, closed when a client is too slow to send."""

    def __init__(self, manager: Any, *, read_timeout: float, open_: _Open,
                 **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.okq_open = open_
        self.okq_read_timeout = read_timeout
        self.okq_timer: asyncio.TimerHandle | None = None
        self.okq_seen = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self.okq_seen = self._request_count
        self.okq_timer = asyncio.get_running_loop().call_later(self.okq_read_timeout,
                                                               self._check)

    def _check(self) -> None:
        """Closed unless a request is being handled or one finished since the last look."""
        if self._request_in_progress or self._request_count != self.okq_seen:
            self._arm()
        else:
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.okq_timer is not None:
            self.okq_timer.cancel()
        self.okq_open.n -= 1
        super().connection_lost(exc)


class _QuietBadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a header over the limit, garbage) as an
    error with a traceback: any client could fill the log. They are answered 4xx;
    here they are logged at debug level instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and record.levelno > logging.DEBUG:
            logging.getLogger("okq.server").debug("refused a malformed request: %s", exc)
            return False
        return True


def quiet_bad_requests() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietBadRequests) for f in logger.filters):
        logger.addFilter(_QuietBadRequests())


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context from --tls-cert and --tls-key (TLS 1.2 at least)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


def handler_args(settings: Settings) -> dict[str, Any]:
    """aiohttp's limits on what one request may carry, and its access log: a line
    per request only with ``--access-log`` (formatting and writing one costs about
    a fifth of what a small lease costs otherwise)."""
    return {"max_line_size": settings.max_header_bytes,
            "max_field_size": settings.max_header_bytes, "max_headers": 128,
            "access_log": access_logger if settings.access_log else None}


async def listen(runner: web.AppRunner, settings: Settings) -> asyncio.Server:
    """Serve ``runner``'s app on the settings' host and port, guarded as above."""
    server = runner.server
    assert server is not None, "the runner is set up first"
    quiet_bad_requests()
    loop = asyncio.get_running_loop()
    args = {"loop": loop, **handler_args(settings)}
    open_ = _Open()

    def connection() -> asyncio.Protocol:
        if open_.n >= settings.max_connections:
            return _Refuse()
        open_.n += 1
        return _Guarded(server, read_timeout=settings.request_read_timeout, open_=open_,
                        **args)

    return await loop.create_server(connection, settings.host, settings.port,
                                    ssl=tls_context(settings), reuse_address=True,
                                    backlog=min(settings.max_connections, 4096))
