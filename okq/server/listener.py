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
  refused (431, aiohttp's parser), as are more than 128 header fields.
- **Bodies**: over ``--max-body-bytes``, 413.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from aiohttp import web

from okq.settings import Settings

_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nRetry-After: 1\r\nContent-Length: 91\r\n\r\n"
            b'{"code": "overloaded", "message": "too many open connections to this node", '
            b'"details": {}}')


class _Refuse(asyncio.Protocol):
    """One connection too many: a 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSED)
        transport.close()


class _Guarded(web.RequestHandler):
    """aiohttp's connection handler, closed when a client is too slow to send."""

    def __init__(self, manager: Any, *, read_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
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
        super().connection_lost(exc)


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context from --tls-cert and --tls-key (TLS 1.2 at least)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


def handler_args(settings: Settings) -> dict[str, Any]:
    """aiohttp's limits on what one request may carry."""
    return {"max_line_size": settings.max_header_bytes,
            "max_field_size": settings.max_header_bytes, "max_headers": 128}


async def listen(runner: web.AppRunner, settings: Settings) -> asyncio.Server:
    """Serve ``runner``'s app on the settings' host and port, guarded as above."""
    server = runner.server
    assert server is not None, "the runner is set up first"
    loop = asyncio.get_running_loop()
    args = {"loop": loop, **handler_args(settings)}

    def connection() -> asyncio.Protocol:
        if len(server.connections) >= settings.max_connections:
            return _Refuse()
        return _Guarded(server, read_timeout=settings.request_read_timeout, **args)

    return await loop.create_server(connection, settings.host, settings.port,
                                    ssl=tls_context(settings), reuse_address=True,
                                    backlog=min(settings.max_connections, 4096))
