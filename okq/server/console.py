"""The web console (docs/CONSOLE.md): static files under ``/ui``, and the two
endpoints the console needed that the API did not have.

The page is plain HTML, CSS and JavaScript shipped in the package (``okq/server/ui/``,
no build step, no third-party code). It calls the node's ``/v1`` API from the browser
with the user's key, so the middleware and the pipeline authorize every call
exactly as they do any client's: the console has no rights of its own.

- ``auth.whoami``: who the key is (role, namespace, prefixes) and which operations
  it may call, so that the page shows only the buttons the key may use;
- ``fleet.status``: the processes that report themselves in the namespace
  (``okq.presence``), the sequencer roles as their objects say, and the store's
  requests per second and their monthly price, the same whichever node answers.
  One answer per namespace is kept ``FLEET_CACHE_S`` seconds: a dozen open
  consoles cost the store what one does.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import Field

from okq.errors import FormatError, ObjectNotFound
from okq.presence import PRICES, Report, dollars_per_month, read_reports
from okq.sequencer import RoleRecord, role_prefix
from okq.server.codec import respond
from okq.server.handlers import parse
from okq.server.state import NAMESPACE, NODE_ID, PRINCIPAL, STORE
from okq.store import Store, list_all
from okq.wire import Body

UI_DIR = Path(__file__).parent / "ui"
#: The console's files and their types: nothing else under /ui is served.
FILES = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css"}
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
FLEET_CACHE_S = 5.0
FLEET_CACHE = web.AppKey("fleet_cache", dict)


class WhoamiRequest(Body):
    pass


class WhoamiResponse(Body):
    key_id: str = Field(description="the key's id ('(none)' on a node that asks for none)")
    role: str
    namespace: str = Field(description="the namespace the request acted in")
    prefixes: list[str] = Field(description="queue name prefixes it acts on (none: all)")
    operations: list[str] = Field(description="the /v1 operations this key may call")


class FleetStatusRequest(Body):
    pass


class ProcessOut(Body):
    id: str
    kind: str = Field(description="node or compactor")
    url: str
    started_at: datetime
    reported_at: datetime
    age: float = Field(description="seconds since its last report")
    live: bool = Field(description="reported within three of its intervals")
    interval: float
    requests: dict[str, int] = Field(description="object-store requests since it started")
    per_s: dict[str, float] = Field(description="object-store requests per second, by "
                                                "operation, over its last interval")
    dollars_per_month: float
    info: dict[str, Any]


class RoleOut(Body):
    shard: int
    holder: str
    url: str
    epoch: int
    members: dict[str, str]


class FleetStatusResponse(Body):
    namespace: str
    node: str = Field(description="the id of the node that answered")
    processes: list[ProcessOut]
    roles: list[RoleOut]
    per_s: dict[str, float] = Field(description="the live processes' store requests per "
                                                "second, by operation")
    dollars_per_month: float = Field(description="per_s at S3 Standard request prices")
    prices: dict[str, float] = Field(description="dollars per request, by operation")


def install(app: web.Application, *, pages: bool = True) -> None:
    """The console's endpoints' state, and (``pages``) its files under /ui, read once
    here."""
    app[FLEET_CACHE] = {}
    if pages:
        _serve_pages(app)


def _serve_pages(app: web.Application) -> None:
    pages = {name: (UI_DIR / name).read_bytes() for name in FILES}

    async def page(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or "index.html"
        if name not in pages:
            raise web.HTTPNotFound()
        return web.Response(body=pages[name], content_type=FILES[name], headers=HEADERS)

    async def to_slash(request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    app.router.add_get("/ui", to_slash)
    app.router.add_get("/ui/", page)
    app.router.add_get("/ui/{name}", page)


# -- the endpoints -------------------------------------------------------------------


async def whoami(request: web.Request) -> web.Response:
    await parse(request, WhoamiRequest)
    who = request[PRINCIPAL]
    operations = sorted({r.resource.canonical[len("/v1/"):] for r in request.app.router.routes()
                         if r.method == "POST" and r.resource is not None
                         and r.resource.canonical.startswith("/v1/")
                         and who.may(r.resource.canonical[len("/v1/"):])})
    return respond(request, WhoamiResponse(key_id=who.key_id, role=who.role,
                                           namespace=request[NAMESPACE],
                                           prefixes=list(who.prefixes), operations=operations))


async def fleet_status(request: web.Request) -> web.Response:
    await parse(request, FleetStatusRequest)
    ns, cache = request[NAMESPACE], request.app[FLEET_CACHE]
    cached = cache.get(ns)
    if cached is None or time.monotonic() - cached[0] > FLEET_CACHE_S:
        cached = (time.monotonic(), await _fleet(request.app, ns))
        cache[ns] = cached
    return respond(request, cached[1])


async def _fleet(app: web.Application, ns: str) -> FleetStatusResponse:
    store = app[STORE]
    reports, roles = await asyncio.gather(read_reports(store, ns), _roles(store, ns))
    now_ms = int(time.time() * 1000)
    processes = [_process(r, now_ms) for r in reports]
    per_s: dict[str, float] = {}
    for p in processes:
        if p.live:
            for op, rate in p.per_s.items():
                per_s[op] = round(per_s.get(op, 0.0) + rate, 4)
    return FleetStatusResponse(namespace=ns, node=app[NODE_ID], processes=processes,
                               roles=roles, per_s=per_s,
                               dollars_per_month=round(dollars_per_month(per_s), 4),
                               prices=PRICES)


def _process(r: Report, now_ms: int) -> ProcessOut:
    return ProcessOut(id=r.id, kind=r.kind, url=r.url, started_at=_dt(r.started_ms),
                      reported_at=_dt(r.at_ms), age=round(r.age(now_ms), 1),
                      live=r.live(now_ms), interval=r.interval, requests=r.requests,
                      per_s=r.per_s, dollars_per_month=round(dollars_per_month(r.per_s), 4),
                      info=r.info)


async def _roles(store: Store, ns: str) -> list[RoleOut]:
    """The sequencer role objects as they are now (none outside sequencer mode)."""
    prefix = role_prefix(ns)
    out = []
    async for info in list_all(store, prefix):
        try:
            shard = int(info.key[len(prefix):])
            record = RoleRecord.decode((await store.get(info.key)).data)
        except (ValueError, KeyError, TypeError, ObjectNotFound, FormatError):
            continue  # released meanwhile, or not a role object
        out.append(RoleOut(shard=shard, holder=record.holder, url=record.url,
                           epoch=record.epoch, members=record.members))
    return sorted(out, key=lambda r: r.shard)


def _dt(value_ms: int) -> datetime:
    return datetime.fromtimestamp(value_ms / 1000, UTC)
