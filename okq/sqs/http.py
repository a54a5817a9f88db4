"""The SQS API on the node's port: one aiohttp handler for both protocols.

A request is SQS's when it is sent to ``/`` or to a queue URL (``/<namespace>/<queue>``);
it speaks the JSON protocol when it carries ``X-Amz-Target``, the query protocol
otherwise. The handler reads the body, verifies the signature
(``okq.sqs.auth``), parses the parameters (``okq.sqs.protocol``), runs the action
(``okq.sqs.actions``) and renders the reply or SQS's error in the request's protocol.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from okq.auth import Principal
from okq.errors import OkqError
from okq.httpbody import read_within
from okq.ops import Context
from okq.pipeline import Pipeline
from okq.service import QueueService
from okq.settings import Settings
from okq.sqs import messages as msg
from okq.sqs import protocol as proto
from okq.sqs.actions import Call, SqsApi, as_sqs
from okq.sqs.auth import PRESIGN_PARAMS, Caller, Signed, verify
from okq.sqs.errors import SqsError
from okq.sqs.queues import Names

log = logging.getLogger("okq.sqs")

_TARGET_PREFIX = "AmazonSQS."
#: Paths of the SQS API: the service endpoint and queue URLs. A first segment that
#: reads like one of okq's own (``v1``, ``v2``, ..., ``internal``) is never a queue
#: URL's namespace: okq answers it (404, 405) as it answers any path of its API. A
#: queue of such a namespace is reached with QueueUrl in the body, posted to ``/``.
PATHS = ("/", r"/{namespace:(?!(?:v[0-9]+|internal)/)[^/]+}/{queue}")


class SqsFrontEnd:
    """The SQS API of one node: its keys, how it names queues, its pipelines."""

    def __init__(self, settings: Settings,
                 pipelines: Callable[[str], Awaitable[Pipeline]]) -> None:
        credentials = settings.sqs_credentials()
        self.keys = {k: (secret, ns) for k, (secret, ns, _, _) in credentials.items()}
        #: who each key is: a role and queue prefixes in its namespace, as an API key
        self.principals = {k: Principal(k, role, ns, prefixes)
                           for k, (_, ns, role, prefixes) in credentials.items()}
        self.namespace = settings.namespace
        self.unsigned_namespace = settings.namespace if settings.sqs_unsigned else None
        self.region = settings.sqs_region
        self.base_url = settings.sqs_url.rstrip("/") if settings.sqs_url else None
        self.pipelines = pipelines  # a namespace's pipeline (the node's tenants)
        self.read_timeout = settings.request_read_timeout
        self.api = SqsApi(settings.max_item_bytes)
        self.stale_deletes = 0
        self.answers: dict[tuple[str, str], int] = {}  # (action, code) -> count
        if self.unsigned_namespace is not None:
            log.warning("--sqs-unsigned: the SQS API accepts unsigned requests, acting with "
                        "every right in namespace %r: for local development only",
                        self.unsigned_namespace)
        if not self.keys and self.unsigned_namespace is None:
            log.info("the SQS API is on but no --sqs-keys are set: it refuses every request")

    def caller(self, request: web.Request, body: bytes) -> Caller:
        return verify(Signed(request.method, request.raw_path.split("?", 1)[0],
                             request.query_string, request.headers, body),
                      self.keys, unsigned_namespace=self.unsigned_namespace)

    def principal(self, caller: Caller) -> Principal:
        """Who the caller is (unsigned, with --sqs-unsigned: admin in its namespace)."""
        if caller.access_key is None:
            return Principal("(unsigned)", "admin", caller.namespace)
        return self.principals[caller.access_key]

    async def service(self, caller: Caller, gone: Callable[[], bool],
                      rid: str = "") -> QueueService:
        """The caller's queue service: its namespace's pipeline, as its key (a node in
        sequencer mode serves its own namespace only: a key of another is refused as
        SQS refuses an unknown account)."""
        try:
            pipeline = await self.pipelines(caller.namespace)
            return QueueService.over(pipeline, Context(self.principal(caller), gone, rid=rid))
        except OkqError as exc:
            raise SqsError("InvalidClientTokenId", f"this access key acts in namespace "
                           f"{caller.namespace!r}, which this node cannot serve: "
                           f"{exc.message}") from None

    def names(self, request: web.Request, namespace: str) -> Names:
        base = self.base_url or f"{request.scheme}://{request.host}"
        return Names(base, self.region, namespace)

    def count(self, action: str, code: str) -> None:
        """Count an answer (actions this API does not know are counted as unknown:
        a client must not grow the metrics without bound)."""
        key = (action if self.api.knows(action) else "unknown", code)
        self.answers[key] = self.answers.get(key, 0) + 1


SQS = web.AppKey("sqs", SqsFrontEnd)


def install(app: web.Application, settings: Settings,
            pipelines: Callable[[str], Awaitable[Pipeline]]) -> None:
    """Serve the SQS API in ``app`` (after okq's own routes); ``pipelines`` gives the
    pipeline of a namespace."""
    front = SqsFrontEnd(settings, pipelines)
    app[SQS] = front
    for path in PATHS:
        app.router.add_route("POST", path, handle)
        app.router.add_route("GET", path, handle)

    async def close(_: web.Application) -> None:
        await front.api.close()

    app.on_shutdown.append(close)


async def handle(request: web.Request) -> web.StreamResponse:
    front = request.app[SQS]
    json_protocol = "X-Amz-Target" in request.headers
    request_id = str(uuid.uuid4())
    action = "unknown"
    try:
        body = await _body(request)
        caller = front.caller(request, body)
        action, params = _parse(request, body, json_protocol)
        handler = front.api.action(action)
        call = Call(await front.service(caller, functools.partial(_client_gone, request),
                                        request_id),
                    front.names(request, caller.namespace),
                    caller.access_key,
                    trace=msg.trace_header(request.headers.get("X-Amzn-Trace-Id")))
        result = await handler(call, params)
    except (SqsError, OkqError) as exc:
        err = exc if isinstance(exc, SqsError) else as_sqs(exc)
        front.count(action, err.code)
        return _error(err, json_protocol, request_id)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("internal error %s in SQS %s", request_id, action)
        front.count(action, "InternalFailure")
        return _error(SqsError("InternalFailure", f"internal error {request_id}"),
                      json_protocol, request_id)
    front.count(action, "OK")
    headers = {"x-amzn-RequestId": request_id}
    if call.stale_deletes:
        front.stale_deletes += call.stale_deletes
        headers["x-okq-stale-receipt"] = str(call.stale_deletes)
    if json_protocol:
        return web.Response(body=json.dumps(result).encode(), headers=headers,
                            content_type=proto.JSON_CONTENT_TYPE)
    return web.Response(body=proto.xml_reply(action, result, request_id), headers=headers,
                        content_type="text/xml")


def _client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _body(request: web.Request) -> bytes:
    try:
        return await read_within(request, request.app[SQS].read_timeout)
    except TimeoutError:
        raise SqsError("RequestTimeout", "the request body did not arrive in time") from None
    except ConnectionError:
        raise SqsError("InvalidParameterValue", "the connection closed before the body "
                       "arrived") from None
    except web.HTTPRequestEntityTooLarge:
        raise SqsError("InvalidParameterValue", "The request body is over the node's limit "
                       "(--max-body-bytes)") from None


def _parse(request: web.Request, body: bytes, json_protocol: bool) -> tuple[str, dict[str, Any]]:
    """The action and its parameters, in the JSON protocol's shape."""
    if json_protocol:
        target = request.headers["X-Amz-Target"]
        if not target.startswith(_TARGET_PREFIX):
            raise SqsError("InvalidAction", f"unknown target {target!r}")
        params = proto.from_json(body)
        action = target[len(_TARGET_PREFIX):]
    else:
        try:
            text = body.decode() if body else ""
            pairs = [(k, v) for k, v in parse_qsl(request.query_string, keep_blank_values=True)
                     if k not in PRESIGN_PARAMS] + \
                parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text))
        except (UnicodeDecodeError, ValueError):
            raise SqsError("MalformedQueryString", "the body is not a form of "
                           "name=value pairs") from None
        form = dict(pairs)
        action = form.pop("Action", "")
        form.pop("Version", None)
        if not action:
            raise SqsError("MissingAction", "The request must contain the parameter Action.")
        params = proto.from_query([(k, v) for k, v in pairs if k not in ("Action", "Version")])
    if "namespace" in request.match_info and "QueueUrl" not in params:
        params["QueueUrl"] = request.path  # the query protocol posts to the queue's URL
    return action, params


def _error(err: SqsError, json_protocol: bool, request_id: str) -> web.Response:
    headers = {"x-amzn-RequestId": request_id}
    if json_protocol:
        body, extra = proto.json_error(err)
        return web.Response(status=err.status, body=body, headers={**headers, **extra},
                            content_type=proto.JSON_CONTENT_TYPE)
    return web.Response(status=err.status, body=proto.xml_error(err, request_id),
                        headers=headers, content_type="text/xml")
