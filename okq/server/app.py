"""The okq node: the lease API over aiohttp.

``create_app(settings, store)`` builds the application from its parts, each in
its own module, imported in this order with no cycle:

- ``okq.server.state``: typed ``web.AppKey`` state, the engine opened in a
  cleanup context, the namespaces' pipelines (``okq.pipeline``) the handlers
  and the SQS API hand their operations to;
- ``okq.server.middleware``: API keys, okq's exceptions as ``{code, message,
  details}`` bodies, request metrics;
- ``okq.server.handlers``: one function per endpoint;
- ``okq.server.routes``: the route table;
- ``okq.server.openapi``: the OpenAPI document, built from the route table;
- ``okq.server.console``: the web console's files under ``/ui`` (unless
  ``--no-console``) and its two endpoints' state;
- ``okq.sqs``: the SQS-compatible API on the same port (unless ``--no-sqs``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from okq.fleetwire import FORWARD_PATH, PING_PATH
from okq.server import console, openapi
from okq.server.handlers import forward, ping
from okq.server.middleware import errors_and_metrics
from okq.server.routes import OPERATIONS, ROUTES
from okq.server.state import METRICS, TENANTS, install
from okq.settings import Settings
from okq.sqs import http as sqs_http
from okq.store import Store


def create_app(settings: Settings, store: Store, *, clock: Any = None) -> web.Application:
    app = web.Application(middlewares=[errors_and_metrics],
                          client_max_size=settings.max_body_bytes)
    install(app, settings, store, clock=clock)
    for route in ROUTES:
        app.router.add_post(route.path, route.handler)
    for path, handler in OPERATIONS:
        app.router.add_get(path, handler)
    app.router.add_get("/openapi.json", openapi.serve)
    app.router.add_post(FORWARD_PATH, forward)
    app.router.add_get(PING_PATH, ping)
    console.install(app, pages=settings.console)
    if settings.sqs:  # last: okq's own routes win over SQS's /<namespace>/<queue>
        sqs_http.install(app, settings, app[TENANTS].pipeline)
        app[METRICS].watch_sqs(app[sqs_http.SQS])
    return app
