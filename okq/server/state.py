"""A node's state: typed ``web.AppKey`` entries, and the engine's life.

``install`` opens what a node holds (the counting store, the engine, its
pipeline, the metrics) and ties the engine to the app: started in a cleanup
context, long polls let go at shutdown, pending produce batches flushed and the
store closed at cleanup. Handlers and the middleware read these keys; nothing
here knows the routes.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from okq.auth import KeyRing, Principal
from okq.engine import Engine
from okq.pipeline import Meters, Pipeline, build
from okq.presence import Reporter
from okq.sequencer import Sequencer
from okq.server.health import Health, StoreWatch
from okq.server.metrics import DepthGauges, Metrics
from okq.server.tenants import Tenants, admission
from okq.service import QueueService
from okq.settings import Settings
from okq.store import CountingStore, Store
from okq.tokens import TokenSigner

ENGINE = web.AppKey("engine", Engine)
#: The node's own namespace's pipeline (a forward enters it), and a service over it
#: for the node's own work (the depth gauges).
PIPELINE = web.AppKey("pipeline", Pipeline)
SERVICE = web.AppKey("service", QueueService)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
STORE = web.AppKey("store", CountingStore)
KEYRING = web.AppKey("keyring", KeyRing)
#: What the middleware puts in each /v1 request: who asks, and in which namespace.
PRINCIPAL = web.RequestKey("principal", Principal)
NAMESPACE = web.RequestKey("namespace", str)
TENANTS = web.AppKey("tenants", Tenants)
HEALTH = web.AppKey("health", Health)
DEPTH = web.AppKey("depth", DepthGauges)
SEQUENCER: web.AppKey[Sequencer | None] = web.AppKey("sequencer")
FLEET_KEYS = web.AppKey("fleet_keys", list)
#: This node's id: its sequencer id, or one made at start (its presence report's).
NODE_ID = web.AppKey("node_id", str)
PRESENCE = web.AppKey("presence", Reporter)

log = logging.getLogger("okq.server")


def install(app: web.Application, settings: Settings, store: Store, *,
            clock: Any = None) -> None:
    """Put a node's state in ``app``, and its engine's start and stop in its life cycle."""
    counting = store if isinstance(store, CountingStore) else CountingStore(store)
    # Every part works through the watch: /health answers from its notes.
    watched = StoreWatch(counting)
    keys = settings.keys()
    engine = Engine(watched, TokenSigner(keys, settings.token_format), namespace=settings.namespace,
                    clock=clock, options=settings.engine_options())
    app[SETTINGS] = settings
    app[STORE] = counting
    app[ENGINE] = engine
    sequencer = None
    if settings.sequencer:
        sequencer = Sequencer(watched, settings.namespace, keys,
                              shards=settings.sequencer_shards, role_ttl=settings.role_ttl,
                              url=settings.advertise_url)
    app[SEQUENCER] = sequencer
    app[NODE_ID] = sequencer.id if sequencer is not None else secrets.token_hex(6)
    app[FLEET_KEYS] = keys
    app[METRICS] = metrics = Metrics()
    meters = Meters(metrics.items, metrics.batch)
    app[PIPELINE] = pipeline = build(engine, admission(settings), meters=meters,
                                     sequencer=sequencer,
                                     default_partitions=settings.default_partitions)
    app[SERVICE] = QueueService.over(pipeline)
    app[HEALTH] = Health(watched, settings.namespace)
    app[KEYRING] = KeyRing(watched, settings.api_key_set(), required=settings.require_api_keys,
                           ttl=settings.api_key_cache)
    app[TENANTS] = Tenants(settings, watched, keys, pipeline, meters, clock=clock)
    app[METRICS].watch(engine, counting, sequencer)
    app[DEPTH] = DepthGauges(app[SERVICE], engine.queues_served, app[METRICS],
                             settings.depth_interval, settings.depth_max_queues)
    app[PRESENCE] = Reporter(counting, settings.namespace, app[NODE_ID], "node",
                             interval=settings.report_interval, info=lambda: _node_info(app))
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_stop_waiting)


def advertise(app: web.Application, host: str, port: int, scheme: str = "http") -> None:
    """The node listens on ``host:port``: where other nodes reach it, unless set."""
    sequencer = app[SEQUENCER]
    if sequencer is not None and not sequencer.url:
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        sequencer.url = f"{scheme}://{host}:{port}"
        log.info("sequencer mode: other nodes reach this one at %s", sequencer.url)
    report = app[PRESENCE].report
    report.url = report.url or (
        sequencer.url if sequencer is not None and sequencer.url
        else app[SETTINGS].advertise_url or f"{scheme}://{host}:{port}")


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine, settings, sequencer = app[ENGINE], app[SETTINGS], app[SEQUENCER]
    await engine.start(self_check=settings.self_check)
    if sequencer is not None:
        await sequencer.start()
    app[PRESENCE].start()
    yield
    await app[PRESENCE].stop()
    if sequencer is not None:
        await sequencer.stop()  # gives its roles up: another node takes them at once
    await app[TENANTS].close()
    await engine.close()  # flushes pending produce batches
    await app[STORE].close()


def _node_info(app: web.Application) -> dict[str, Any]:
    """What a node's presence report says of it beside its requests."""
    sequencer = app[SEQUENCER]
    return {"sequencer": sequencer is not None,
            "roles": sequencer.held() if sequencer is not None else [],
            "namespaces": app[TENANTS].served()}


async def _stop_waiting(app: web.Application) -> None:
    app[ENGINE].stop_waiting()
    app[TENANTS].stop_waiting()
