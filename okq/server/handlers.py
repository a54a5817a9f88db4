"""The node's endpoints, one function each: parse the body into its wire model,
turn it into an operation (``okq.ops``), run that through the pipeline of the
request's namespace (``okq.pipeline``) and answer with the response model.

Policy (authorization, metering, admission, routing, the retry batch) is the
pipeline's; what is left here is HTTP: a validation error as a 400 that names its
field, and whether the caller's connection is still open.
"""

from __future__ import annotations

import difflib
import logging
from datetime import datetime
from typing import Any, TypeVar, get_args

import msgpack
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from okq import ops
from okq import wire as s
from okq.auth import Principal, StoredKey, describe
from okq.clock import assume_utc
from okq.engine import BrowsedItem, QueueInfo
from okq.errors import Forbidden, InvalidRequest, OkqError
from okq.fleetwire import FORWARD_VERSION, SIGNATURE_HEADER, Misdirected, verify
from okq.headers import split_meta, with_headers
from okq.model import QueueConfig, with_group
from okq.ops import Context, Outputs, Retry
from okq.publisher import NewItem, Produced
from okq.server.codec import (
    body_format,
    decode_body,
    lease_reply_plain,
    read_body,
    read_bytes,
    respond,
    respond_msgpack,
    wants_msgpack,
)
from okq.server.health import store_kind
from okq.server.middleware import public_details
from okq.server.state import (
    DEPTH,
    FLEET_KEYS,
    HEALTH,
    KEYRING,
    METRICS,
    NAMESPACE,
    PIPELINE,
    PRINCIPAL,
    SEQUENCER,
    SETTINGS,
    STORE,
    TENANTS,
)

log = logging.getLogger("okq.server")

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

#: Who a forward acts as: the fleet signature stood for a key.
FLEET = Principal("fleet", "admin", None)


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
        retention_dead_letter=c.retention_dead_letter, partitions=c.partitions,
        read_only=c.read_only, fifo=c.fifo,
        created_at=dt(i.created_ms),
        segments=i.segments, produced=i.produced,
    )


def _item(i: BrowsedItem) -> s.ItemOut:
    meta, headers = split_meta(i.meta)
    return s.ItemOut(
        id=i.id, state=i.state, attempts=i.attempts, produced_at=dt(i.produced_ms),
        ready_at=dt(i.ready_ms) if i.ready_ms is not None else None, bytes=i.payload,
        utf8=text(i.payload), meta=meta, error=i.error, headers=headers,
    )


async def _new_items(request: web.Request, items: list[s.ProduceItem], *,
                     keys: bool = True) -> list[NewItem]:
    """The items to produce; a ``delay`` counts from now by the node's clock."""
    now_ms = 0
    if any(i.delay is not None for i in items):
        now_ms = (await request.app[TENANTS].pipeline(request[NAMESPACE])).clock.now_ms()
    return [NewItem(i.payload(),
                    ms(i.enqueue_at) if i.delay is None else now_ms + int(i.delay * 1000),
                    i.key if keys else None, with_group(with_headers(None, i.headers), i.group))
            for i in items]


# -- who asks, and in which namespace ---------------------------------------------------


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def run(request: web.Request, op: ops.Op[R]) -> R:
    """Run ``op`` through the pipeline of the request's namespace, as its key (the
    middleware found who asks and where; the pipeline decides what they may do)."""
    pipeline = await request.app[TENANTS].pipeline(request[NAMESPACE])
    return await pipeline.handle(op, Context(request[PRINCIPAL], lambda: _client_gone(request)))


# -- the lease API ---------------------------------------------------------------


async def produce(request: web.Request) -> web.Response:
    kind = body_format(request)
    data = await read_bytes(request)
    plain = s.plain_produce(data) if kind == "msgpack" else None
    if plain is not None:  # binary payloads and nothing else: no model per item
        queue, items = plain[0], [NewItem(p) for p in plain[1]]
    else:
        body = _validate(decode_body(data, kind), s.ProduceRequest)
        queue, items = body.queue_name, await _new_items(request, body.items)
    ids = await run(request, ops.Produce(queue, items))
    duplicates = ids.duplicates if isinstance(ids, Produced) else None
    if wants_msgpack(request):
        return respond_msgpack(s.produce_reply_plain(queue, ids, duplicates))
    return respond(request, s.ProduceResponse.model_construct(queue_name=queue, ids=ids,
                                                              duplicates=duplicates))


async def lease(request: web.Request) -> web.Response:
    body = await parse(request, s.LeaseRequest)
    items = await run(request, ops.Lease(body.queue_name, body.batch_size, body.lease_timeout,
                                         body.request_timeout))
    if wants_msgpack(request):  # the hot path: no model per item
        return respond_msgpack(lease_reply_plain(body.queue_name, items))
    return respond(request, s.LeaseResponse(queue_name=body.queue_name,
                                            items=[s.leased_item_out(i) for i in items]))


async def renew(request: web.Request) -> web.Response:
    body = await parse(request, s.RenewRequest)
    deadline = await run(request, ops.Renew(body.queue_name, body.token, body.lease_timeout))
    return respond(request, s.RenewResponse(queue_name=body.queue_name,
                                            lease_deadline=dt(deadline)))


async def complete(request: web.Request) -> web.Response:
    kind = body_format(request)
    data = await read_bytes(request)
    plain = s.plain_tokens(data) if kind == "msgpack" else None
    outputs = None
    if plain is not None:  # tokens and nothing else: no model
        queue, tokens = plain
    else:
        body = _validate(decode_body(data, kind), s.CompleteRequest)
        queue, tokens = body.queue_name, body.tokens
        if body.outputs is not None:
            outputs = Outputs(body.outputs.queue_name,
                              await _new_items(request, body.outputs.items, keys=False))
    output_ids = await run(request, ops.Complete(queue, tokens, outputs))
    if wants_msgpack(request):
        return respond_msgpack(s.complete_reply_plain(queue, len(tokens), output_ids))
    return respond(request, s.CompleteResponse.model_construct(
        queue_name=queue, completed=len(tokens), output_ids=output_ids))


async def retry(request: web.Request) -> web.Response:
    body = await parse(request, s.RetryRequest)
    retries = [Retry(i.token, retry_at_ms=ms(i.retry_at), dead=i.dead, error=i.error,
                     count_attempt=i.count_attempt) for i in body.items]
    outcome = await run(request, ops.RetryItems(body.queue_name, retries))
    outcome.raise_if_failed()
    return respond(request, s.RetryResponse(queue_name=body.queue_name, retried=outcome.retried,
                                            dead_lettered=outcome.dead_lettered))


# -- queues and views -------------------------------------------------------------


async def stats(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueRequest)
    st = await run(request, ops.Stats(body.queue_name))
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
    await run(request, ops.Purge(body.queue_name))
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
    info = await run(request, ops.CreateQueue(body.name, config))
    return respond(request, _info(info), 201)


async def queues_list(request: web.Request) -> web.Response:
    await parse(request, s.QueuesListRequest)
    infos = await run(request, ops.QueueInfos())
    return respond(request, s.QueuesListResponse(queues=[_info(i) for i in infos]))


async def queues_info(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueNameRequest)
    return respond(request, _info(await run(request, ops.GetQueue(body.name))))


async def queues_update(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueUpdate)
    changes = _config(body)
    if body.dead_queue == "":  # cleared: no dead-letter queue
        changes["dead_queue"] = None
    info = await run(request, ops.UpdateQueue(body.name, changes))
    return respond(request, _info(info))


async def queues_delete(request: web.Request) -> web.Response:
    body = await parse(request, s.QueueNameRequest)
    await run(request, ops.DeleteQueue(body.name))
    return respond(request, s.DeleteResponse(name=body.name))


async def items_list(request: web.Request) -> web.Response:
    body = await parse(request, s.ItemsListRequest)
    items, after = await run(request, ops.Browse(body.queue_name, body.start_after, body.limit))
    return respond(request, s.ItemsListResponse(
        queue_name=body.queue_name, items=[_item(i) for i in items], next_start_after=after))


async def dead_redrive(request: web.Request) -> web.Response:
    body = await parse(request, s.RedriveRequest)
    moved = await run(request, ops.Redrive(body.queue_name, body.limit, body.destination))
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
    """An operation another node of the fleet sent to this one (sequencer mode).

    Signed with the fleet's signing key; msgpack both ways. It must name this node
    and its namespace (421 otherwise: the sender's holder is gone from this address)
    and carry a sequence number its sender has not used (401 otherwise: a replay).
    The operation runs through this node's pipeline from admit down. The reply
    carries the result in the operation's wire form (``ok``) or the okq error
    (``err``), whether this node holds the queue's role (``held``) and for how many
    seconds it vouches for it (``for``) and which renewal of it (``nonce``), so a
    sender with an old view looks again."""
    sequencer = request.app[SEQUENCER]
    body = await read_bytes(request)
    if sequencer is None:
        raise web.HTTPNotFound()
    verify(request.app[FLEET_KEYS], body, request.headers.get(SIGNATURE_HEADER, ""))
    try:
        call = msgpack.unpackb(body)
        version = call.get("v")
    except (ValueError, AttributeError, TypeError, msgpack.ExtraData) as exc:
        raise InvalidRequest(f"malformed forward: {exc}", field="body") from None
    if version != FORWARD_VERSION:
        raise web.HTTPConflict(reason=f"forward version {version!r} unknown here")
    try:
        sequencer.accept(call)
    except Misdirected as exc:
        raise web.HTTPMisdirectedRequest(reason=str(exc)) from None
    sequencer.heard_from(str(call.get("from", "")), str(call.get("url", "")))
    op = ops.from_wire(call.get("op"))
    ctx = Context(FLEET, lambda: _client_gone(request), forwarded=True,
                  rid=str(call.get("rid", "")))
    reply: dict[str, Any] = {}
    try:
        reply["ok"] = op.pack_result(await request.app[PIPELINE].forwarded(op, ctx))
    except OkqError as exc:
        if exc.status >= 500:
            log.warning("forwarded %s %s from %s: %s", op.name, ctx.rid, call.get("from"), exc)
        reply["err"] = {"code": exc.code, "message": exc.message,
                        "details": public_details(exc)}
    reply["held"] = sequencer.holds(op.queue)
    reply["for"], reply["nonce"] = sequencer.vouch(op.queue)
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
