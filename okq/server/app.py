"""The okq node: the lease API over aiohttp.

``create_app(settings, store)`` builds the application: a route table, typed
``web.AppKey`` state, the engine opened in a cleanup context, one error
middleware mapping okq's exceptions to ``{code, message, details}`` bodies.
"""

from __future__ import annotations

import asyncio
import difflib
import hmac
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, get_args

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from okq.engine import BrowsedItem, Engine, LeasedItem, QueueInfo
from okq.errors import (
    InvalidRequest,
    LeaseLost,
    OkqError,
    Overloaded,
    QueueNotFound,
    TooLarge,
    Unauthorized,
)
from okq.model import QueueConfig
from okq.publisher import NewItem
from okq.server import schemas as s
from okq.server.codec import read_body, respond
from okq.server.metrics import Metrics
from okq.settings import Settings
from okq.store import CountingStore, Store
from okq.tokens import TokenSigner

log = logging.getLogger("okq.server")

ENGINE = web.AppKey("engine", Engine)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
STORE = web.AppKey("store", CountingStore)
WAITING = web.AppKey("waiting", Counter)  # long polls waiting, by queue
API_KEYS = web.AppKey("api_keys", frozenset)

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def dt(value_ms: int) -> datetime:
    return datetime.fromtimestamp(value_ms / 1000, UTC)


def text(payload: bytes) -> str | None:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return None


async def parse(request: web.Request, model: type[M]) -> M:
    body = await read_body(request)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise invalid(exc, model) from None


def field_path(loc: tuple[int | str, ...]) -> str:
    """('items', 0, 'token') -> 'items[0].token', the form used in every message."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def invalid(exc: ValidationError, model: type[BaseModel] | None = None) -> InvalidRequest:
    """The first error, as a 400 naming its field. An unknown field comes first: a
    misspelt ``itemz`` also makes ``items`` missing, and the typo is what to fix."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where = field_path(err["loc"]) or "body"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field" + _did_you_mean(model, err["loc"])
    elif err["type"] == "missing":
        msg = "field required"
    return InvalidRequest(f"{where}: {msg}", field=where, errors=len(errors))


def _did_you_mean(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    """'; did you mean items?' when an unknown field is close to a known one."""
    if model is None or not loc or not isinstance(loc[-1], str):
        return ""
    known = _fields_at(model, loc[:-1])
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the object at ``loc`` inside ``model`` (list indexes skipped)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
    return list(current.model_fields) if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside an annotation such as ``list[Item]`` or ``Outputs | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def check_batch(request: web.Request, n: int, field: str) -> None:
    """413 for a batch over the node's ``--max-batch``, as for any other size limit."""
    limit = request.app[SETTINGS].max_batch
    if n > limit:
        raise TooLarge(f"{field} holds {n} entries; the limit is {limit}", field=field,
                       limit=limit)


def check_repeats(tokens: list[str], pattern: str) -> None:
    """A token may appear once per request (``pattern`` has ``{n}``): a repeat would be
    counted twice although it names one delivery."""
    seen: dict[str, int] = {}
    for n, token in enumerate(tokens):
        if token in seen:
            here, first = pattern.format(n=n), pattern.format(n=seen[token])
            raise InvalidRequest(f"{here} repeats {first}", field=here)
        seen[token] = n


# -- middleware ---------------------------------------------------------------


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> s.ErrorBody:
    return s.ErrorBody(code=code, message=message, details=details or {})


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource \
        else "unmatched"
    began = time.perf_counter()
    response = await _handle(request, handler)
    metrics.requests.labels(endpoint, str(response.status)).inc()
    metrics.latency.labels(endpoint).observe(time.perf_counter() - began)
    return response


def _authorize(request: web.Request) -> None:
    keys = request.app[API_KEYS]
    if not keys or not request.path.startswith("/v1/"):
        return
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not any(
        hmac.compare_digest(key.strip(), k) for k in keys
    ):
        raise Unauthorized("a valid API key is required: 'Authorization: Bearer KEY'")


async def _handle(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        _authorize(request)
        return await handler(request)
    except Overloaded as exc:
        retry_after = {"Retry-After": str(max(1, round(exc.retry_after)))}
        return respond(request, error_body(exc.code, exc.message, exc.details), exc.status,
                       retry_after)
    except OkqError as exc:
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, exc)
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        details = {k: v for k, v in exc.details.items() if k != "key"}
        return respond(request, error_body(exc.code, exc.message, details), exc.status, headers)
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


# -- handlers -------------------------------------------------------------------


def _leased(i: LeasedItem) -> s.LeasedItemOut:
    return s.LeasedItemOut(
        id=i.id, token=i.token, attempts=i.attempts, lease_deadline=dt(i.lease_deadline_ms),
        produced_at=dt(i.produced_ms),
        enqueue_at=dt(i.enqueue_at_ms) if i.enqueue_at_ms is not None else None,
        bytes=i.payload, utf8=text(i.payload), meta=i.meta,
    )


def _info(i: QueueInfo) -> s.QueueInfoOut:
    c = i.config
    return s.QueueInfoOut(
        name=i.name, lease_timeout=c.lease_timeout, retention=c.retention,
        max_attempts=c.max_attempts, dead_queue=c.dead_queue,
        retention_dead_letter=c.retention_dead_letter, created_at=dt(i.created_ms),
        segments=i.segments, produced=i.produced,
    )


def _item(i: BrowsedItem) -> s.ItemOut:
    return s.ItemOut(
        id=i.id, state=i.state, attempts=i.attempts, produced_at=dt(i.produced_ms),
        ready_at=dt(i.ready_ms) if i.ready_ms is not None else None, bytes=i.payload,
        utf8=text(i.payload), meta=i.meta, error=i.error,
    )


async def produce(request: web.Request) -> web.Response:
    body = await parse(request, s.ProduceRequest)
    check_batch(request, len(body.items), "items")
    engine, settings = request.app[ENGINE], request.app[SETTINGS]
    if engine.pending_produce(body.queue_name) > settings.max_pending_produce:
        raise Overloaded("too many items waiting to be published on this queue; retry later",
                         retry_after=1, queue=body.queue_name)
    items = [NewItem(i.payload(), ms(i.enqueue_at), i.key) for i in body.items]
    ids = await engine.produce(body.queue_name, items)
    request.app[METRICS].batch.labels("produce").observe(len(items))
    request.app[METRICS].items.labels("produced").inc(len(items))
    return respond(request, s.ProduceResponse(queue_name=body.queue_name, ids=ids))


async def lease(request: web.Request) -> web.Response:
    body = await parse(request, s.LeaseRequest)
    check_batch(request, body.batch_size, "batch_size")
    engine, settings = request.app[ENGINE], request.app[SETTINGS]
    if body.request_timeout > settings.max_wait:
        raise InvalidRequest(f"request_timeout: at most {settings.max_wait} seconds",
                             field="request_timeout")
    waiting = request.app[WAITING]
    if body.request_timeout > 0 and waiting[body.queue_name] >= settings.max_waiting:
        raise Overloaded(
            f"{settings.max_waiting} lease requests are already waiting on this queue",
            retry_after=1, queue=body.queue_name,
        )
    waiting[body.queue_name] += 1
    try:
        items = await engine.lease(body.queue_name, body.batch_size,
                                   lease_timeout=body.lease_timeout, wait=body.request_timeout)
    finally:
        waiting[body.queue_name] -= 1
    if items and _client_gone(request):
        await _give_back(engine, items, body.queue_name)
        items = []
    request.app[METRICS].batch.labels("lease").observe(len(items))
    request.app[METRICS].items.labels("leased").inc(len(items))
    return respond(request, s.LeaseResponse(queue_name=body.queue_name,
                                            items=[_leased(i) for i in items]))


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _give_back(engine: Engine, items: list[LeasedItem], queue: str) -> None:
    """Release, uncounted, what a lease took for a client that has gone (a worker
    stopped by Ctrl-C while its long poll waited): nobody would get the tokens, and
    the items would sit leased until their lease timed out. A release that fails
    leaves the item to that timeout."""
    for item in items:
        try:
            await engine.retry(item.token, queue=queue, count_attempt=False,
                               error="the lease request's client went away")
        except OkqError as exc:
            log.info("could not give back %s after its client went away: %s", item.id, exc)


async def renew(request: web.Request) -> web.Response:
    body = await parse(request, s.RenewRequest)
    deadline = await request.app[ENGINE].renew(body.token, body.lease_timeout,
                                                queue=body.queue_name)
    return respond(request, s.RenewResponse(queue_name=body.queue_name,
                                            lease_deadline=dt(deadline)))


async def complete(request: web.Request) -> web.Response:
    body = await parse(request, s.CompleteRequest)
    check_batch(request, len(body.tokens), "tokens")
    if body.outputs is not None:
        check_batch(request, len(body.outputs.items), "outputs.items")
    engine = request.app[ENGINE]
    engine.check_tokens(body.tokens, body.queue_name, "tokens[{n}]")
    check_repeats(body.tokens, "tokens[{n}]")
    output_ids = None
    if body.outputs is not None:
        items = [NewItem(i.payload(), ms(i.enqueue_at)) for i in body.outputs.items]
        output_ids = await engine.complete_and_produce(
            body.tokens[0], body.outputs.queue_name, items, queue=body.queue_name)
        request.app[METRICS].items.labels("produced").inc(len(items))
    else:
        await engine.complete(body.tokens, queue=body.queue_name)
    request.app[METRICS].batch.labels("complete").observe(len(body.tokens))
    request.app[METRICS].items.labels("completed").inc(len(body.tokens))
    return respond(request, s.CompleteResponse(queue_name=body.queue_name,
                                               completed=len(body.tokens),
                                               output_ids=output_ids))


async def retry(request: web.Request) -> web.Response:
    body = await parse(request, s.RetryRequest)
    check_batch(request, len(body.items), "items")
    engine = request.app[ENGINE]
    tokens = [i.token for i in body.items]
    engine.check_tokens(tokens, body.queue_name, "items[{n}].token")
    check_repeats(tokens, "items[{n}].token")
    done = 0
    failed: list[dict[str, Any]] = []
    for n, item in enumerate(body.items):
        try:
            await engine.retry(item.token, retry_at_ms=ms(item.retry_at), dead=item.dead,
                               error=item.error, queue=body.queue_name,
                               field_name=f"items[{n}].token",
                               count_attempt=item.count_attempt)
            done += 1
        except LeaseLost as exc:
            failed.append({"index": n, "reason": exc.message})
    request.app[METRICS].items.labels("retried").inc(done)
    if failed:
        landed = f"; the other {done} landed" if done else ""
        raise LeaseLost(f"{len(failed)} of {len(body.items)} retries refused: the lease was "
                        f"lost{landed}", failed=failed)
    return respond(request, s.RetryResponse(queue_name=body.queue_name, retried=done))


async def stats(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueRequest)
    st = await request.app[ENGINE].stats(body.queue_name)
    request.app[METRICS].queue_stats[body.queue_name] = st
    return respond(request, s.StatsResponse(
        queue_name=st.queue, available=st.available, in_flight=st.in_flight,
        scheduled=st.scheduled, waiting_retry=st.waiting_retry, dead=st.dead,
        dead_lettered=st.dead_lettered, completed=st.completed, redriven=st.redriven,
        segments=st.segments,
        oldest_age=st.oldest_age_s,
    ))


async def purge(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueRequest)
    await request.app[ENGINE].purge(body.queue_name)
    return respond(request, s.PurgeResponse(queue_name=body.queue_name))


def _config(body: s.QueueSettings) -> dict[str, Any]:
    """The settings given; null means 'the default' (create) or 'unchanged' (update)."""
    return body.model_dump(exclude_unset=True, exclude_none=True, exclude={"name"})


async def queues_create(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueCreate)
    try:
        config = QueueConfig.model_validate(_config(body))
    except ValidationError as exc:
        raise invalid(exc, s.QueueCreate) from None
    info = await request.app[ENGINE].create_queue(body.name, config)
    return respond(request, _info(info), 201)


async def queues_list(request: web.Request) -> web.Response:
    await parse(request, s.QueuesListRequest)
    engine = request.app[ENGINE]
    infos = []
    for name in await engine.list_queues():
        try:
            infos.append(_info(await engine.get_queue(name)))
        except QueueNotFound:
            continue  # deleted while listing
    return respond(request, s.QueuesListResponse(queues=infos))


async def queues_info(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueNameRequest)
    return respond(request, _info(await request.app[ENGINE].get_queue(body.name)))


async def queues_update(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueUpdate)
    info = await request.app[ENGINE].update_queue(body.name, **_config(body))
    return respond(request, _info(info))


async def queues_delete(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueNameRequest)
    await request.app[ENGINE].delete_queue(body.name)
    return respond(request, s.DeleteResponse(name=body.name))


async def items_list(request: web.Request) -> web.Response:
    body = await parse(request, s.ItemsListRequest)
    items, after = await request.app[ENGINE].browse(
        body.queue_name, start_after=body.start_after, limit=body.limit)
    return respond(request, s.ItemsListResponse(
        queue_name=body.queue_name, items=[_item(i) for i in items], next_start_after=after))


async def dead_redrive(request: web.Request) -> web.Response:
    body = await parse(request, s.RedriveRequest)
    moved = await request.app[ENGINE].redrive(body.queue_name, body.limit)
    return respond(request, s.RedriveResponse(queue_name=body.queue_name, moved=moved))


async def health(request: web.Request) -> web.Response:
    store = request.app[STORE]
    try:
        await asyncio.wait_for(store.list(f"{request.app[ENGINE].ns}/manifests/", limit=1), 5)
    except (OkqError, TimeoutError) as exc:
        return respond(request, s.HealthResponse(status=f"store unavailable: {exc}",
                                                 store=store.url), 503)
    return respond(request, s.HealthResponse(status="ok", store=store.url))


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    from okq.server.openapi import document

    return web.json_response(document())


#: (path, handler, request model, response model): the route table, and the
#: source of the OpenAPI document.
ROUTES: list[tuple[str, Handler, type[BaseModel], type[BaseModel], str]] = [
    ("/v1/queue.produce", produce, s.ProduceRequest, s.ProduceResponse,
     "Produce items; returns their ids once durable."),
    ("/v1/queue.lease", lease, s.LeaseRequest, s.LeaseResponse,
     "Lease up to batch_size ready items; long-polls up to request_timeout."),
    ("/v1/queue.renew", renew, s.RenewRequest, s.RenewResponse, "Extend a lease."),
    ("/v1/queue.complete", complete, s.CompleteRequest, s.CompleteResponse,
     "Complete leased items."),
    ("/v1/queue.retry", retry, s.RetryRequest, s.RetryResponse,
     "Release leased items for a retry, or dead-letter them."),
    ("/v1/queue.stats", stats, s.QueueRequest, s.StatsResponse, "Counts by state."),
    ("/v1/queue.purge", purge, s.QueueRequest, s.PurgeResponse, "Drop every item."),
    ("/v1/queues.create", queues_create, s.QueueCreate, s.QueueInfoOut, "Create a queue."),
    ("/v1/queues.list", queues_list, s.QueuesListRequest, s.QueuesListResponse,
     "List queues."),
    ("/v1/queues.info", queues_info, s.QueueNameRequest, s.QueueInfoOut,
     "A queue's configuration."),
    ("/v1/queues.update", queues_update, s.QueueUpdate, s.QueueInfoOut,
     "Change a queue's configuration; omitted fields keep their values."),
    ("/v1/queues.delete", queues_delete, s.QueueNameRequest, s.DeleteResponse,
     "Delete a queue and its items."),
    ("/v1/items.list", items_list, s.ItemsListRequest, s.ItemsListResponse,
     "Browse live items without leasing them."),
    ("/v1/dead.redrive", dead_redrive, s.RedriveRequest, s.RedriveResponse,
     "Move dead-lettered items back to their source queues."),
]


def create_app(settings: Settings, store: Store, *, clock: Any = None) -> web.Application:
    app = web.Application(middlewares=[errors_and_metrics],
                          client_max_size=settings.max_body_bytes)
    counting = store if isinstance(store, CountingStore) else CountingStore(store)
    engine = Engine(counting, TokenSigner(settings.keys()), namespace=settings.namespace,
                    clock=clock, options=settings.engine_options())
    app[SETTINGS] = settings
    app[STORE] = counting
    app[ENGINE] = engine
    app[METRICS] = Metrics()
    app[WAITING] = Counter()
    app[API_KEYS] = settings.api_key_set()
    app[METRICS].watch(engine, counting)
    for path, handler, *_ in ROUTES:
        app.router.add_post(path, handler)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_stop_waiting)
    return app


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine, settings = app[ENGINE], app[SETTINGS]
    await engine.start(self_check=settings.self_check)
    yield
    await engine.close()  # flushes pending produce batches
    await app[STORE].close()


async def _stop_waiting(app: web.Application) -> None:
    app[ENGINE].stop_waiting()
