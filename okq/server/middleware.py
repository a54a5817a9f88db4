"""The node's one middleware: API keys, okq's errors as ``{code, message, details}``
bodies with their HTTP status, and request metrics."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from okq import wire as s
from okq.auth import NAMESPACE_HEADER, open_principal
from okq.batcher import CALLER
from okq.errors import Forbidden, OkqError, Overloaded, TooLarge, Unauthorized
from okq.keys import check_name
from okq.server.codec import respond
from okq.server.state import KEYRING, METRICS, NAMESPACE, PRINCIPAL, SETTINGS

log = logging.getLogger("okq.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def public_details(exc: OkqError) -> dict[str, Any]:
    """What an error's details may show a caller: not the store key it concerns."""
    return {k: v for k, v in exc.details.items() if k != "key"}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> s.ErrorBody:
    return s.ErrorBody(code=code, message=message, details=details or {})


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource \
        else "unmatched"
    began = time.perf_counter()
    CALLER.set(request.protocol)  # the connection: one request at a time (okq.batcher)
    response = await _handle(request, handler)
    metrics.observe_request(endpoint, response.status, time.perf_counter() - began)
    return response




async def _authenticate(request: web.Request) -> None:
    """Who a /v1 request acts as and in which namespace (401 without a valid key where
    one is needed, 403 in another namespace). A role that may not call the endpoint
    is refused here too, before its body is read; the pipeline's authorize layer
    (``okq.pipeline``) checks the role and the queue prefixes of every operation."""
    if not request.path.startswith("/v1/") or request.match_info.http_exception is not None:
        return
    ring, settings = request.app[KEYRING], request.app[SETTINGS]
    header = request.headers.get("Authorization")
    if header is None:
        if ring.required:
            raise Unauthorized("a valid API key is required: 'Authorization: Bearer KEY'")
        principal = open_principal()
    else:
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("a valid API key is required: the Authorization header must be "
                               "'Bearer KEY'")
        principal = await ring.principal(key.strip())
    operation = request.path[len("/v1/"):]
    if not principal.may(operation):
        raise Forbidden(f"a {principal.role} key may not call {operation}", role=principal.role)
    asked = request.headers.get(NAMESPACE_HEADER)
    if asked is not None:
        check_name(asked, NAMESPACE_HEADER)
    namespace = asked or principal.namespace or settings.namespace
    principal.check_namespace(namespace)
    request[PRINCIPAL] = principal
    request[NAMESPACE] = namespace


async def _handle(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        await _authenticate(request)
        return await handler(request)
    except Overloaded as exc:
        retry_after = {"Retry-After": str(max(1, round(exc.retry_after)))}
        return respond(request, error_body(exc.code, exc.message, exc.details), exc.status,
                       retry_after)
    except OkqError as exc:
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, exc)
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return respond(request, error_body(exc.code, exc.message, public_details(exc)),
                       exc.status, headers)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_body_bytes
        err = TooLarge(f"the request body is over the limit of {limit} bytes",
                       field="body", limit=limit)
        return respond(request, error_body(err.code, err.message, err.details), 413)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        keep = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return respond(request, error_body(code, exc.reason), exc.status, keep or None)
    except asyncio.CancelledError:
        raise
    except Exception:
        ref = uuid.uuid4().hex[:12]
        log.exception("internal error %s on %s %s", ref, request.method, request.path)
        return respond(request, error_body("internal", "internal error", {"ref": ref}), 500)
