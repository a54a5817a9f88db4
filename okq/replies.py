"""The client's reading of the replies it gets per message: a lease's items and a
produce's ids, decoded straight from the node's bytes into typed structs
(msgspec) instead of dicts checked by pydantic.

A lease reply is the one whose size grows with the traffic: each item used to be
unpacked into a dict (nine keys decoded and interned), validated by
``LeasedItemOut``'s pydantic model (a Python call per payload, two datetimes
parsed) and given its ``utf8`` through pydantic's ``__setattr__``: about 34,000
instructions an item, most of the client's CPU per consumed message
(benchmarks/bench_client_cpu.py). Here msgspec decodes the reply against
typed declarations (``_Item``), matching keys without making new strings and
parsing the times in C, with every field's type checked as it goes (a reply that
does not fit raises ``msgspec.DecodeError``); each item's dict of checked values
then becomes the ``__dict__`` of the ``LeasedItemOut`` the user gets, built
without a second validation. The result is the same model,
with the same attribute values, as validating the reply with ``LeaseResponse``
and filling in ``utf8`` (tests/unit/test_replies.py holds them equal, msgpack and
JSON). The node's replies are unchanged: the same bytes as before are read.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any, NotRequired, TypedDict, cast

import msgspec

from okq.wire import LeasedItemOut


class _Item(TypedDict):
    """A leased item as the node sends it (``okq.wire.leased_item_plain``; a JSON reply
    also carries ``utf8``, and its ``bytes`` as base64). Decoded as a dict of checked
    values, it becomes the item's ``__dict__``. Unknown keys are skipped, so a newer
    node may add some."""

    id: str
    token: str
    attempts: int
    lease_deadline: datetime
    produced_at: datetime
    enqueue_at: NotRequired[datetime | None]
    bytes: builtins.bytes
    utf8: NotRequired[str | None]
    meta: NotRequired[dict[str, Any] | None]
    headers: NotRequired[dict[str, str]]


class _LeaseReply(msgspec.Struct):
    queue_name: str
    items: list[_Item]


class _ProduceReply(msgspec.Struct):
    queue_name: str
    ids: list[str]


_LEASE: dict[str, msgspec.msgpack.Decoder[_LeaseReply] | msgspec.json.Decoder[_LeaseReply]] = {
    "msgpack": msgspec.msgpack.Decoder(_LeaseReply),
    "json": msgspec.json.Decoder(_LeaseReply),
}
_PRODUCE = msgspec.msgpack.Decoder(_ProduceReply)
#: LeasedItemOut's fields in their order: every one is set on every item, as
#: validation would have it, and in this order (the JSON of ``model_dump_json``).
_ORDER = tuple(LeasedItemOut.model_fields)
#: The fields set on an item whose reply left ``headers`` out (it has none).
_NO_HEADERS = frozenset(_ORDER) - {"headers"}
_new = LeasedItemOut.__new__
_set = object.__setattr__


def leased_items(raw: bytes, kind: str = "msgpack") -> list[LeasedItemOut]:
    """The items of a ``queue.lease`` reply body (``kind`` msgpack or json), each with
    ``utf8`` filled in when its payload is UTF-8 and ``headers`` ({} when the reply
    left them out); ``msgspec.DecodeError`` for a body that is not a lease reply.

    Each is built as ``model_construct`` builds a model (its checked values as its
    ``__dict__``, in the model's order, every field set, no extra, no private
    attributes), without its per-field loop: the values were checked as they were
    decoded. One loop, no call per item: this is the client's hottest code."""
    items = []
    for fields in cast(list[dict[str, Any]], _LEASE[kind].decode(raw).items):
        utf8 = fields.get("utf8")
        if utf8 is None:  # a msgpack reply carries the payload once, as bytes
            try:
                utf8 = fields["bytes"].decode()
            except UnicodeDecodeError:
                utf8 = None
        meta = fields.pop("meta", None)  # the node's order, with utf8 before meta
        headers = fields.pop("headers", None)  # sent only when there are some
        fields["utf8"] = utf8
        fields["meta"] = meta
        fields["headers"] = {} if headers is None else headers
        if tuple(fields) != _ORDER:  # another order, or enqueue_at left out (None)
            fields = {name: fields.get(name) for name in _ORDER}
        item = _new(LeasedItemOut)
        _set(item, "__dict__", fields)
        _set(item, "__pydantic_fields_set__", set(_ORDER if headers is not None else _NO_HEADERS))
        _set(item, "__pydantic_extra__", None)
        _set(item, "__pydantic_private__", None)
        items.append(item)
    return items


def produced_ids(raw: bytes) -> list[str]:
    """The ids of a msgpack ``queue.produce`` reply; ``msgspec.DecodeError`` for a body
    that is not a produce reply."""
    return _PRODUCE.decode(raw).ids
