"""A fault-injecting HTTP proxy between okq processes and an S3 server, for tests.

Real node processes cannot be handed a ``FaultyStore``; this proxy gives them
the faults instead, on the wire. Point a node's ``--endpoint-url`` at
``proxy.endpoint`` and every S3 request passes through it, forwarded verbatim
(method, path, query, headers including ``Host``, body), so a SigV4 signature
computed for the proxy's address stays valid for a server that checks it (the
test SeaweedFS does not: see tests/servers.py).

A :class:`Rule` says what to do to the requests it matches (method, a regex on
the path, how many times, with what probability): delay them, lose them before
they reach the server, or let them land and then hold the reply until the test
calls :meth:`Rule.release`, and answer 500 or drop the connection. The last one
is the ambiguous write of docs/DESIGN.md, with a window in which the test can
make another writer act before the caller learns anything. Rules with
``times=None`` and a ``probability`` make a steady fault rate for a campaign.

The proxy serves on 127.0.0.1 (port 0: any free one) from its own event loop
in a daemon thread, so it works under synchronous and asynchronous tests alike.
With ``clients=N`` it also listens on the same port of 127.0.0.2 ... 127.0.0.N+1
(``endpoint_for(k)``): a process pointed at its own address can be singled out by
a rule's ``client``, to cut one node off from the store while the others reach it.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
from aiohttp import web

from tests.loopserver import LoopServer

HOST = "127.0.0.1"
#: Headers that describe one connection, not the request; aiohttp sets its own.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "expect", "content-length",
})
_ERROR_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
               b"<Message>injected by the test proxy</Message></Error>")
Reply = Literal["pass", "error", "drop"]


@dataclass(eq=False)
class Rule:
    """What happens to the requests a rule matches (the first matching rule wins).

    ``forward=False`` loses the request (the server never sees it); otherwise it
    is forwarded, after ``delay`` seconds. With ``hold`` the server's reply is
    kept until :meth:`release` (or ``hold_timeout``). Then the client gets
    ``reply``: the server's own answer, a 500, or a dropped connection.
    """

    method: str | None = None  # None: any method
    path: str = ""  # a regex searched in the URL path (without the query)
    times: int | None = 1  # matching requests it applies to; None: every one
    probability: float = 1.0
    delay: float = 0.0
    forward: bool = True
    hold: bool = False
    reply: Reply = "pass"
    hold_timeout: float = 30.0
    client: str | None = None  # only requests that came in on this address (endpoint_for)
    matched: list[str] = field(default_factory=list)  # method and path of each hit
    held: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._regex = re.compile(self.path)

    def wants(self, method: str, path: str, local: str = HOST) -> bool:
        if self.times is not None and len(self.matched) >= self.times:
            return False
        if self.client is not None and self.client != local:
            return False
        return (self.method is None or self.method == method) and bool(
            self._regex.search(path))

    def release(self) -> None:
        """Let held replies go to their clients."""
        self.released.set()

    async def until_held(self, timeout: float = 10.0) -> None:
        """Wait until a matched request has landed and its reply is being held."""
        if not await asyncio.to_thread(self.held.wait, timeout):
            raise TimeoutError(f"no request matched {self.method} {self.path!r} "
                               f"within {timeout} s")


class S3Proxy(LoopServer):
    """``with S3Proxy(upstream) as proxy:`` — forward to ``upstream``, with faults."""

    def __init__(self, upstream: str, *, seed: int | None = None, clients: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self.endpoint = ""
        self.clients = clients
        self.requests: Counter[str] = Counter()  # by method, everything that came in
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- rules -----------------------------------------------------------------
    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every rule, releasing any reply still held."""
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            rule.release()

    @staticmethod
    def client_host(k: int) -> str:
        """The loopback address the ``k``-th client (1, 2, ...) is to use."""
        return f"127.0.0.{k + 1}"

    def endpoint_for(self, k: int) -> str:
        """The endpoint of the ``k``-th client (``clients`` of them): requests that come
        in there match rules with ``client=client_host(k)``."""
        if not 1 <= k <= self.clients:
            raise ValueError(f"the proxy listens for clients 1 to {self.clients}")
        return self.endpoint.replace(HOST, self.client_host(k))

    def _match(self, method: str, path: str, local: str = HOST) -> Rule | None:
        with self._lock:
            self.requests[method] += 1
            for rule in self._rules:
                if (rule.wants(method, path, local)
                        and self._random.random() < rule.probability):
                    rule.matched.append(f"{method} {path}")
                    return rule
        return None

    # -- serving ---------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        rule = self._match(request.method, request.path, sockname[0] if sockname else HOST)
        if rule is None:
            return await self._forward(request, body)
        if rule.delay:
            await asyncio.sleep(rule.delay)
        answer = await self._forward(request, body) if rule.forward else None
        if rule.hold:
            rule.held.set()
            await asyncio.get_running_loop().run_in_executor(
                None, rule.released.wait, rule.hold_timeout)
        if rule.reply == "drop":
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # aiohttp's way to end a handler with no reply
        if rule.reply == "error" or answer is None:
            return web.Response(status=500, body=_ERROR_BODY, content_type="application/xml")
        return answer

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        assert self._http is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        try:
            async with self._http.request(
                request.method, self.upstream + request.rel_url.raw_path_qs,
                headers=headers, data=body, allow_redirects=False, auto_decompress=False,
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            ) as resp:
                data = await resp.read()
                kept = [(k, v) for k, v in resp.headers.items() if k.lower() not in _HOP_BY_HOP]
                return web.Response(status=resp.status, body=data, headers=kept)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.Response(status=502, text=f"test proxy: upstream failed: {exc}")

    async def _setup(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        app = web.Application(client_max_size=256 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.endpoint = f"http://{HOST}:{port}"
        for k in range(1, self.clients + 1):
            await web.TCPSite(self._runner, self.client_host(k), port).start()

    async def _teardown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def stop(self) -> None:
        self.clear()
        super().stop()
