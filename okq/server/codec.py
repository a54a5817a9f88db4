"""Request and response encoding: JSON or msgpack, chosen by Content-Type and Accept."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import msgpack
import msgspec
from aiohttp import web
from pydantic import BaseModel

from okq.errors import InvalidRequest, RequestTimeout, UnsupportedMediaType
from okq.httpbody import read_within
from okq.leases import LeasedItem, reply_rows
from okq.server.state import SETTINGS
from okq.wire import LeasedItemPlain, LeaseReplyPlain, iso_time

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
JSON = "application/json"


def wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return any(t in accept for t in MSGPACK_TYPES)


#: Content-Types read as JSON: JSON itself, and curl's default for ``-d`` (the body
#: is still JSON). A request without a Content-Type is read as JSON too.
JSON_TYPES = (JSON, "application/x-www-form-urlencoded")


def body_format(request: web.Request) -> str:
    """'json' or 'msgpack', from the Content-Type; 415 for any other type.

    aiohttp reports a missing header as ``application/octet-stream``, so the raw
    header decides whether one was sent at all."""
    if not request.headers.get("Content-Type", "").strip():
        return "json"
    ctype = request.content_type
    if ctype in MSGPACK_TYPES:
        return "msgpack"
    if ctype in JSON_TYPES:
        return "json"
    raise UnsupportedMediaType(
        f"unsupported Content-Type {ctype!r}: use application/json or application/msgpack",
        field="Content-Type",
    )


def decode(data: bytes, kind: str) -> Any:
    """The body's value; InvalidRequest (field ``body``) when it does not decode."""
    try:
        if kind == "msgpack":
            return msgpack.unpackb(data, raw=False, timestamp=3)
        return json.loads(data)
    except (ValueError, OverflowError, RecursionError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as exc:
        if isinstance(exc, RecursionError | msgpack.StackError):
            reason = "nested too deeply"
        else:
            reason = str(exc) or type(exc).__name__
        name = "msgpack" if kind == "msgpack" else "JSON"
        raise InvalidRequest(f"the body is not valid {name}: {reason}", field="body") from None


async def read_bytes(request: web.Request) -> bytes:
    """The body, within the node's --request-read-timeout: a client that trickles
    its body is cut off (408) instead of holding a handler."""
    timeout = request.app[SETTINGS].request_read_timeout
    try:
        return await read_within(request, timeout)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g} s") from None
    except ConnectionError:  # the client went away mid-body: its mistake, not an error here
        raise InvalidRequest("the connection closed before the body arrived",
                             field="body") from None


async def read_body(request: web.Request) -> dict[str, Any]:
    """The body as a dict, decoded by its Content-Type (JSON when absent)."""
    kind = body_format(request)  # an unsupported type is refused whatever the body
    return decode_body(await read_bytes(request), kind)


def decode_body(data: bytes, kind: str) -> dict[str, Any]:
    """``read_body`` of bytes read already."""
    if not data.strip():
        return {}
    body = decode(data, kind)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be an object", field="body")
    return body


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def respond(request: web.Request, model: BaseModel, status: int = 200,
            headers: dict[str, str] | None = None) -> web.Response:
    if wants_msgpack(request):
        body = msgpack.packb(_plain(model.model_dump()), use_bin_type=True)
        return web.Response(body=body, status=status, content_type=MSGPACK_TYPES[0],
                            headers=headers)
    return web.Response(body=model.model_dump_json().encode(), status=status,
                        content_type=JSON, headers=headers)


def respond_msgpack(body: bytes, status: int = 200) -> web.Response:
    """A msgpack reply encoded already, for the hot paths whose replies would cost
    more as models than as the work they report (``lease_reply_plain``)."""
    return web.Response(body=body, status=status, content_type=MSGPACK_TYPES[0])


_REPLY_ENCODER = msgspec.msgpack.Encoder()


def lease_reply_plain(queue: str, items: list[LeasedItem]) -> bytes:
    """A lease's msgpack reply (the hot path): a ``okq.wire.LeasedItemPlain`` per
    item, no model, made by ``okq.leases.reply_rows`` (compiled with the hot path).
    Here rather than in okq.wire, which clients import too: the hot path is the
    node's."""
    return _REPLY_ENCODER.encode(LeaseReplyPlain(queue, reply_rows(items, iso_time,
                                                                   LeasedItemPlain)))
