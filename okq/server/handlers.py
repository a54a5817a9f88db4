"""The node's endpoints, one function each: parse the body into its wire model,
call the queue service, answer with the response model.

Policy (admission, batch limits, the retry batch) is the service's
(``okq.service``); what is left here is HTTP: a validation error as a 400 that
names its field, the caller gone while its long poll waited, metrics.
"""

from __future__ import annotations

import difflib
from datetime import datetime
from typing import Any, TypeVar, get_args

import msgpack
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from okq import wire as s
from okq.auth import StoredKey, describe
from okq.clock import assume_utc
from okq.engine import BrowsedItem, QueueInfo
from okq.errors import Forbidden, InvalidRequest, OkqError
from okq.fleetwire import FORWARD_VERSION, SIGNATURE_HEADER, Misdirected, verify
from okq.model import QueueConfig
from okq.publisher import NewItem
from okq.routing import RoutedService
from okq.server.codec import read_body, read_bytes, respond, respond_plain, wants_msgpack
from okq.server.health import store_kind
from okq.server.middleware import public_details
from okq.server.state import (
    DEPTH,
    FLEET_KEYS,
    HEALTH,
    KEYRING,
    METRICS,
    NAMESPACE,
    PRINCIPAL,
    SEQUENCER,
    SERVICE,
    SETTINGS,
    STORE,
    TENANTS,
)
from okq.service import Outputs, QueueService, Retry

M = TypeVar("M", bound=BaseModel)


# -- parsing and conversions ----------------------------------------------------


def ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    return int(assume_utc(value).timestamp() * 1000)


dt, text = s.to_datetime, s.utf8_or_none


async def parse(request: web.Request, model: type[M]) -> M:
    return _validate(await read_body(request), model)


def _validate(body: dict[str, Any], model: type[M]) -> M:
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


def _new_items(items: list[s.ProduceItem], *, keys: bool = True) -> list[NewItem]:
    return [NewItem(i.payload(), ms(i.enqueue_at), i.key if keys else None) for i in items]


# -- who asks, and in which namespace ---------------------------------------------------


async def service_for(request: web.Request, *queues: tuple[str, str]) -> QueueService:
    """The service of the request's namespace, once its key may act on each of
    ``queues`` (``(name, field)`` pairs): the middleware checked role and namespace."""
    who = request[PRINCIPAL]
    for name, field in queues:
        who.check_queue(name, field)
    return await request.app[TENANTS].service(request[NAMESPACE])


# -- the lease API ---------------------------------------------------------------


async def produce(request: web.Request) -> web.Response:
    raw = await read_body(request)
    plain = s.plain_produce(raw)
    if plain is not None:  # binary payloads and nothing else: no model per item
        queue, items = plain[0], [NewItem(p) for p in plain[1]]
    else:
        body = _validate(raw, s.ProduceRequest)
        queue, items = body.queue_name, _new_items(body.items)
    ids = await (await service_for(request, (queue, "queue_name"))).produce(queue, items)
    request.app[METRICS].batch.labels("produce").observe(len(items))
    request.app[METRICS].items.labels("produced").inc(len(items))
    return respond(request, s.ProduceResponse.model_construct(queue_name=queue, ids=ids))


async def lease(request: web.Request) -> web.Response:
    body = await parse(request, s.LeaseRequest)
    service = await service_for(request, (body.queue_name, "queue_name"))
    items = await service.lease(body.queue_name, body.batch_size,
                                lease_timeout=body.lease_timeout, wait=body.request_timeout,
                                gone=lambda: _client_gone(request))
    if items and _client_gone(request):
        await service.give_back(body.queue_name, items)
        items = []
    request.app[METRICS].batch.labels("lease").observe(len(items))
    request.app[METRICS].items.labels("leased").inc(len(items))
    if wants_msgpack(request):  # the hot path: no model per item
        return respond_plain(request, {"queue_name": body.queue_name,
                                       "items": [s.leased_item_plain(i) for i in items]})
    return respond(request, s.LeaseResponse(queue_name=body.queue_name,
                                            items=[s.leased_item_out(i) for i in items]))


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def renew(request: web.Request) -> web.Response:
    body = await parse(request, s.RenewRequest)
    service = await service_for(request, (body.queue_name, "queue_name"))
    deadline = await service.renew(body.queue_name, body.token, body.lease_timeout)
    return respond(request, s.RenewResponse(queue_name=body.queue_name,
                                            lease_deadline=dt(deadline)))


async def complete(request: web.Request) -> web.Response:
    raw = await read_body(request)
    plain = s.plain_tokens(raw)
    outputs = None
    if plain is not None:  # tokens and nothing else: no model
        queue, tokens = plain
    else:
        body = _validate(raw, s.CompleteRequest)
        queue, tokens = body.queue_name, body.tokens
        if body.outputs is not None:
            outputs = Outputs(body.outputs.queue_name,
                              _new_items(body.outputs.items, keys=False))
    checked = [(queue, "queue_name")]
    if outputs is not None:
        checked.append((outputs.queue, "outputs.queue_name"))
    output_ids = await (await service_for(request, *checked)).complete(queue, tokens, outputs)
    if outputs is not None:
        request.app[METRICS].items.labels("produced").inc(len(outputs.items))
    request.app[METRICS].batch.labels("complete").observe(len(tokens))
    request.app[METRICS].items.labels("completed").inc(len(tokens))
    return respond(request, s.CompleteResponse.model_construct(
        queue_name=queue, completed=len(tokens), output_ids=output_ids))


async def retry(request: web.Request) -> web.Response:
    body = await parse(request, s.RetryRequest)
    retries = [Retry(i.token, retry_at_ms=ms(i.retry_at), dead=i.dead, error=i.error,
                     count_attempt=i.count_attempt) for i in body.items]
    service = await service_for(request, (body.queue_name, "queue_name"))
    outcome = await service.retry(body.queue_name, retries)
    request.app[METRICS].items.labels("retried").inc(outcome.retried)
    outcome.raise_if_failed()
    return respond(request, s.RetryResponse(queue_name=body.queue_name, retried=outcome.retried))


# -- queues and views -------------------------------------------------------------


async def stats(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueRequest)
    st = await (await service_for(request, (body.queue_name, "queue_name"))).stats(
        body.queue_name)
    if request[NAMESPACE] == request.app[SETTINGS].namespace:  # the gauges name no namespace
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
    await (await service_for(request, (body.queue_name, "queue_name"))).purge(body.queue_name)
    return respond(request, s.PurgeResponse(queue_name=body.queue_name))


def _config(body: s.QueueSettings) -> dict[str, Any]:
    """The settings given; null means 'the default' (create) or 'unchanged' (update)."""
    return body.model_dump(exclude_unset=True, exclude_none=True, exclude={"name"})


def _named(body: s.QueueCreate | s.QueueUpdate) -> list[tuple[str, str]]:
    """The queues a create or update names: itself and its dead-letter queue."""
    out = [(body.name, "name")]
    if body.dead_queue:
        out.append((body.dead_queue, "dead_queue"))
    return out


async def queues_create(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueCreate)
    try:
        config = QueueConfig.model_validate(_config(body))
    except ValidationError as exc:
        raise invalid(exc, s.QueueCreate) from None
    service = await service_for(request, *_named(body))
    info = await service.create_queue(body.name, config)
    return respond(request, _info(info), 201)


async def queues_list(request: web.Request) -> web.Response:
    await parse(request, s.QueuesListRequest)
    infos = [i for i in await (await service_for(request)).queues()
             if request[PRINCIPAL].covers(i.name)]
    return respond(request, s.QueuesListResponse(queues=[_info(i) for i in infos]))


async def queues_info(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueNameRequest)
    service = await service_for(request, (body.name, "name"))
    return respond(request, _info(await service.queue(body.name)))


async def queues_update(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueUpdate)
    service = await service_for(request, *_named(body))
    changes = _config(body)
    if body.dead_queue == "":  # cleared: no dead-letter queue
        changes["dead_queue"] = None
    info = await service.update_queue(body.name, **changes)
    return respond(request, _info(info))


async def queues_delete(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueNameRequest)
    await (await service_for(request, (body.name, "name"))).delete_queue(body.name)
    return respond(request, s.DeleteResponse(name=body.name))


async def items_list(request: web.Request) -> web.Response:
    body = await parse(request, s.ItemsListRequest)
    service = await service_for(request, (body.queue_name, "queue_name"))
    items, after = await service.browse(
        body.queue_name, start_after=body.start_after, limit=body.limit)
    return respond(request, s.ItemsListResponse(
        queue_name=body.queue_name, items=[_item(i) for i in items], next_start_after=after))


async def dead_redrive(request: web.Request) -> web.Response:
    body = await parse(request, s.RedriveRequest)
    service = await service_for(request, (body.queue_name, "queue_name"))
    moved = await service.redrive(body.queue_name, body.limit)
    return respond(request, s.RedriveResponse(queue_name=body.queue_name, moved=moved))


# -- API keys -------------------------------------------------------------------------


def _key_out(key: StoredKey, secret: str | None = None) -> s.KeyOut:
    fields = {**describe(key), "created_at": dt(key.created_ms)}
    del fields["created_ms"]
    return s.KeyCreated(**fields, key=secret) if secret else s.KeyOut(**fields)


async def keys_create(request: web.Request) -> web.Response:
    """A key of the request's namespace, within the asking key's own queues."""
    body = await parse(request, s.KeyCreate)
    who = request[PRINCIPAL]
    if not who.within(body.prefixes):
        raise Forbidden("a key may only make keys for queues it acts on itself: give "
                        f"prefixes starting with {', '.join(map(repr, who.prefixes))}",
                        field="prefixes")
    secret, key = await request.app[KEYRING].create(request[NAMESPACE], body.role,
                                                    body.prefixes, body.name)
    return respond(request, _key_out(key, secret), 201)


async def keys_list(request: web.Request) -> web.Response:
    await parse(request, s.KeysListRequest)
    who = request[PRINCIPAL]
    keys = await request.app[KEYRING].list(request[NAMESPACE])
    return respond(request, s.KeysListResponse(
        keys=[_key_out(k) for k in keys if who.within(list(k.prefixes))]))


async def keys_delete(request: web.Request) -> web.Response:
    body = await parse(request, s.KeyDelete)
    who = request[PRINCIPAL]
    ring = request.app[KEYRING]
    key = await ring.find(body.id, request[NAMESPACE])  # one GET, not a listing of all
    if key is not None and not who.within(list(key.prefixes)):
        raise Forbidden("this key may not delete a key that acts on queues it does not",
                        field="id")
    if key is not None:
        await ring.delete(key)
    return respond(request, s.KeyDeleteResponse(id=body.id, deleted=key is not None))


# -- operations ---------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """200 while the store answered this node lately (docs/OPERATIONS.md, "Health"):
    no store request unless the node has not heard from it for a while."""
    verdict = await request.app[HEALTH].check()
    fields: dict[str, Any] = {"store": store_kind(request.app[STORE].url),
                              "store_heard": verdict.heard_s}
    if not verdict.ok:  # the failure's kind only: no endpoint, bucket or S3 dump
        failure = f": {verdict.failure}" if verdict.failure else ""
        return respond(request, s.HealthResponse(status=f"store unavailable{failure}",
                                                 **fields), 503)
    sequencer = request.app[SEQUENCER]
    if sequencer:
        fields |= {"node": sequencer.id, "roles": sequencer.held()}
    return respond(request, s.HealthResponse(status="ok", **fields))


async def forward(request: web.Request) -> web.Response:
    """A state change another node of the fleet sent to this one (sequencer mode).

    Signed with the fleet's signing key; msgpack both ways. It must name this node
    and its namespace (421 otherwise: the sender's holder is gone from this address)
    and carry a sequence number its sender has not used (401 otherwise: a replay).
    The reply carries the result (``ok``) or the okq error (``err``), whether this
    node holds the queue's role (``held``) and for how many seconds it vouches for
    it (``for``) and which renewal of it (``nonce``), so a sender with an old view
    looks again."""
    service, sequencer = request.app[SERVICE], request.app[SEQUENCER]
    body = await read_bytes(request)
    if not isinstance(service, RoutedService) or sequencer is None:
        raise web.HTTPNotFound()
    verify(request.app[FLEET_KEYS], body, request.headers.get(SIGNATURE_HEADER, ""))
    try:
        call = msgpack.unpackb(body)
        op, queue, args = str(call["op"]), str(call["q"]), dict(call["a"])
    except (ValueError, KeyError, TypeError, msgpack.ExtraData) as exc:
        raise InvalidRequest(f"malformed forward: {exc}", field="body") from None
    if call.get("v") != FORWARD_VERSION:
        raise web.HTTPConflict(reason=f"forward version {call.get('v')!r} unknown here")
    try:
        sequencer.accept(call)
    except Misdirected as exc:
        raise web.HTTPMisdirectedRequest(reason=str(exc)) from None
    sequencer.heard_from(str(call.get("from", "")), str(call.get("url", "")))
    reply: dict[str, Any] = {}
    try:
        reply["ok"] = await service.run_forwarded(op, queue, args,
                                                  lambda: _client_gone(request))
    except OkqError as exc:
        reply["err"] = {"code": exc.code, "message": exc.message,
                        "details": public_details(exc)}
    reply["held"] = sequencer.holds(queue)
    reply["for"], reply["nonce"] = sequencer.vouch(queue)
    return web.Response(body=msgpack.packb(reply, default=_plain),
                        content_type="application/msgpack")


async def ping(request: web.Request) -> web.Response:
    """Whether this node's event loop answers at all (sequencer mode): no store work."""
    return web.Response(text="pong")


def _plain(value: Any) -> Any:
    """Details of an error that msgpack cannot pack go as their text."""
    return str(value)


async def metrics(request: web.Request) -> web.Response:
    await request.app[DEPTH].refresh()  # the depth gauges, at most once per interval
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
