"""A tap on the traffic between sequencer-mode nodes, for the fault campaign.

Each node advertises ``tap.url_for(k, its_url)`` instead of its own URL (see
``LocalFleet(advertise=...)``), so the other nodes send their forwards and pings
for node ``k`` through the tap, which passes them on verbatim and keeps a copy
of every forward: what an observer of the fleet's network would have seen, to
be replayed at the nodes (``captured``).

Like tests/s3proxy.py it serves on loopback from its own event loop in a daemon
thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from okq.fleetwire import FORWARD_PATH, MISDIRECTED, port_refused
from tests.loopserver import LoopServer

HOST = "127.0.0.1"
_PASSED = ("content-type", "x-okq-fleet-signature")


@dataclass(frozen=True)
class Captured:
    """One forward as it went by: to node ``node``, at ``at`` (monotonic)."""

    node: int
    at: float
    body: bytes
    headers: dict[str, str]


class ForwardTap(LoopServer):
    def __init__(self) -> None:
        self.url = ""
        self.nodes: dict[int, str] = {}  # index -> the node's own URL
        self.captured: list[Captured] = []
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    def url_for(self, k: int, node_url: str) -> str:
        """What node ``k`` (reached at ``node_url``) advertises: the tap's path for it."""
        self.nodes[k] = node_url
        return f"{self.url}/n{k}"

    def since(self, at: float) -> list[Captured]:
        with self._lock:
            return [c for c in self.captured if c.at >= at]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        k = int(request.match_info["node"])
        path = "/" + request.match_info["tail"]
        body = await request.read()
        headers = {h: v for h, v in request.headers.items() if h.lower() in _PASSED}
        if path == FORWARD_PATH:
            with self._lock:
                self.captured.append(Captured(k, time.monotonic(), body, headers))
        assert self._http is not None
        try:
            async with self._http.request(request.method, self.nodes[k] + path, data=body,
                                          headers=headers) as resp:
                return web.Response(status=resp.status, body=await resp.read(),
                                    content_type=resp.content_type)
        except aiohttp.ClientConnectorError as exc:
            if port_refused(exc):  # nobody at the node's address: say so, as it would
                return web.Response(status=MISDIRECTED, text="the tapped node is gone")
            raise
        except (aiohttp.ClientError, TimeoutError):
            # As the node's own port would: the connection ends with no answer.
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError from None

    async def _setup(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1000))
        app = web.Application(client_max_size=256 << 20)
        app.router.add_route("*", r"/n{node:\d+}/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, HOST, 0).start()
        self.url = f"http://{HOST}:{self._runner.addresses[0][1]}"

    async def _teardown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()
