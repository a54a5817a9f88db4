"""The OpenAPI 3 document, generated from the route table and the wire models.

Served at ``/openapi.json`` by ``serve``; it reads ``okq.server.routes`` and the
app registers it, so nothing here imports the app."""

from __future__ import annotations

from functools import cache
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import okq
from okq import wire as s
from okq.server.routes import ROUTES

ERRORS = {
    "400": "invalid input; details.field names the field",
    "401": "missing or wrong API key (when the node requires keys)",
    "403": "the key's role, namespace or queue prefixes do not allow this",
    "408": "the body did not arrive within the node's read timeout",
    "404": "unknown queue",
    "409": "lost or stale lease, or the queue exists",
    "413": "payload, batch or body over the node's limit; details.field names it",
    "415": "a Content-Type that is neither JSON nor msgpack",
    "429": "overloaded: retry after Retry-After seconds",
    "503": "the store is unavailable or the produce was not published: retry",
}


#: The namespace an operator key acts in (a namespace key's own, if given).
NAMESPACE_PARAMETER = {
    "name": "X-Okq-Namespace", "in": "header", "required": False,
    "description": "the namespace to act in: an operator key's choice (default: the "
                   "node's); a namespace key may only name its own",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"},
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json_and_msgpack(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "application/json": {"schema": _ref(model)},
        "application/msgpack": {"schema": _ref(model)},
    }


@cache
def document() -> dict[str, Any]:
    models: set[type[BaseModel]] = {s.ErrorBody, s.HealthResponse}
    for _, _, req, resp, _ in ROUTES:
        models.update((req, resp))
    _, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, Any] = {}
    for path, handler, req, resp, summary in ROUTES:
        responses: dict[str, Any] = {
            "200": {"description": "OK", "content": _json_and_msgpack(resp)},
        }
        for status, text in ERRORS.items():
            responses[status] = {"description": text, "content": _json_and_msgpack(s.ErrorBody)}
        paths[path] = {
            "post": {
                "operationId": handler.__name__,
                "summary": summary,
                "parameters": [NAMESPACE_PARAMETER],
                "requestBody": {"required": True, "content": _json_and_msgpack(req)},
                "responses": responses,
            }
        }
    for created in ("/v1/queues.create", "/v1/keys.create"):
        answers = paths[created]["post"]["responses"]
        answers["201"] = answers.pop("200")
    paths["/health"] = {
        "get": {
            "operationId": "health",
            "summary": "Whether the node can reach its store.",
            "responses": {
                "200": {"description": "OK",
                        "content": {"application/json": {"schema": _ref(s.HealthResponse)}}},
                "503": {"description": "store unavailable",
                        "content": {"application/json": {"schema": _ref(s.HealthResponse)}}},
            },
        }
    }
    paths["/metrics"] = {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics.",
            "responses": {"200": {"description": "text exposition format",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "okq", "version": okq.__version__,
                 "description": "A durable queue on object storage: the lease API."},
        "paths": paths,
        "components": {"schemas": defs["$defs"],
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        # /v1 calls carry a key on a node that requires them (docs/SECURITY.md);
        # {} keeps calls without one valid for a node that does not
        "security": [{"apiKey": []}, {}],
    }


async def serve(request: web.Request) -> web.Response:
    return web.json_response(document())
