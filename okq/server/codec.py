"""Request and response encoding: JSON or msgpack, chosen by Content-Type and Accept."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import msgpack
from aiohttp import web
from pydantic import BaseModel

from okq.errors import InvalidRequest, UnsupportedMediaType

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
JSON = "application/json"


def wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return any(t in accept for t in MSGPACK_TYPES)


async def read_body(request: web.Request) -> dict[str, Any]:
    """The body as a dict, decoded by its Content-Type (JSON when absent)."""
    data = await request.read()
    if not data.strip():
        return {}
    ctype = request.content_type
    try:
        if ctype in MSGPACK_TYPES:
            body = msgpack.unpackb(data, raw=False, timestamp=3)
        elif ctype in (JSON, "application/octet-stream", "text/plain", "",
                       # curl -d sends this by default; the body is still JSON
                       "application/x-www-form-urlencoded"):
            body = json.loads(data)
        else:
            raise UnsupportedMediaType(
                f"unsupported Content-Type {ctype!r}: use application/json or "
                "application/msgpack", field="Content-Type",
            )
    except InvalidRequest:
        raise
    except (ValueError, RecursionError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as exc:
        kind = "msgpack" if ctype in MSGPACK_TYPES else "JSON"
        if isinstance(exc, RecursionError | msgpack.StackError):
            reason = "nested too deeply"
        else:
            reason = str(exc) or type(exc).__name__
        raise InvalidRequest(f"the body is not valid {kind}: {reason}", field="body") from None
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
