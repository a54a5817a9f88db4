"""A node's state: typed ``web.AppKey`` entries, and the engine's life.

``install`` opens what a node holds (the counting store, the engine, the queue
service, the metrics) and ties the engine to the app: started in a cleanup
context, long polls let go at shutdown, pending produce batches flushed and the
store closed at cleanup. Handlers and the middleware read these keys; nothing
here knows the routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from okq.engine import Engine
from okq.server.metrics import Metrics
from okq.service import Admission, QueueService
from okq.settings import Settings
from okq.store import CountingStore, Store
from okq.tokens import TokenSigner

ENGINE = web.AppKey("engine", Engine)
SERVICE = web.AppKey("service", QueueService)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
STORE = web.AppKey("store", CountingStore)
API_KEYS = web.AppKey("api_keys", frozenset)


def install(app: web.Application, settings: Settings, store: Store, *,
            clock: Any = None) -> None:
    """Put a node's state in ``app``, and its engine's start and stop in its life cycle."""
    counting = store if isinstance(store, CountingStore) else CountingStore(store)
    engine = Engine(counting, TokenSigner(settings.keys()), namespace=settings.namespace,
                    clock=clock, options=settings.engine_options())
    app[SETTINGS] = settings
    app[STORE] = counting
    app[ENGINE] = engine
    app[SERVICE] = QueueService(engine, Admission.from_settings(settings))
    app[METRICS] = Metrics()
    app[API_KEYS] = settings.api_key_set()
    app[METRICS].watch(engine, counting)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_stop_waiting)


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine, settings = app[ENGINE], app[SETTINGS]
    await engine.start(self_check=settings.self_check)
    yield
    await engine.close()  # flushes pending produce batches
    await app[STORE].close()


async def _stop_waiting(app: web.Application) -> None:
    app[ENGINE].stop_waiting()
