"""The client's reading of the replies it gets per message: a lease's items and a
produce's ids, decoded straight from the node's bytes into typed structs
(msgspec) instead of dicts checked by pydantic.

A lease reply is the one whose size grows with the traffic: each item used to be
unpacked into a dict (nine keys decoded and interned), validated by
``LeasedItemOut``'s pydantic model (a Python call per payload, two datetimes
parsed) and given its ``utf8`` through pydantic's ``__setattr__``: about 34,000
instructions an item, most of the client's CPU per consumed message
(benchmarks/bench_client_cpu.py). Here msgspec decodes the reply into a struct
per item (``_Item``), matching keys without making new strings and parsing the
times in C, with every field's type checked as it goes (a reply that does not fit
raises ``msgspec.DecodeError``); each item's checked values then become, in the
model's order, the ``__dict__`` of the ``LeasedItemOut`` the user gets, built
without a second validation. The result is the same model, with the same
attribute values, as validating the reply with ``LeaseResponse`` and filling in
``utf8`` (tests/unit/test_replies.py holds them equal, msgpack and JSON). The
node's replies are unchanged: the same bytes as before are read.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType
from pydantic import BaseModel

from okq.wire import NEVER_FIRST, LeasedItemOut


class _Item(msgspec.Struct):
    """A leased item as the node sends it (``okq.wire.LeasedItemPlain``; a JSON reply
    also carries ``utf8``, and its ``bytes`` as base64). Unknown keys are skipped, so
    a newer node may add some; UNSET marks a key the reply left out."""

    id: str
    token: str
    attempts: int
    lease_deadline: datetime
    produced_at: datetime
    bytes: builtins.bytes
    enqueue_at: datetime | None = None
    utf8: str | UnsetType | None = UNSET
    meta: dict[str, Any] | None = None
    headers: dict[str, str] | UnsetType = UNSET


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
#: LeasedItemOut's fields: every one is set on every item, as validation would
#: have it (the dict below lists them in the model's order: the JSON of
#: ``model_dump_json``), but ``headers`` when the reply left them out (none).
_ALL_SET = frozenset(LeasedItemOut.model_fields)
_NO_HEADERS_SET = _ALL_SET - {"headers"}
_new = LeasedItemOut.__new__
# A model's slots, set through their descriptors: a third cheaper than
# object.__setattr__, which looks each up through the class's MRO.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def leased_items(raw: bytes, kind: str = "msgpack") -> list[LeasedItemOut]:
    """The items of a ``queue.lease`` reply body (``kind`` msgpack or json), each with
    ``utf8`` filled in when its payload is UTF-8 and ``headers`` ({} when the reply
    left them out); ``msgspec.DecodeError`` for a body that is not a lease reply.

    Each is built as ``model_construct`` builds a model (its checked values as its
    ``__dict__``, in the model's order, every field set, no extra, no private
    attributes), without its per-field loop: the values were checked as they were
    decoded. One loop, no call per item: this is the client's hottest code."""
    items = []
    for it in _LEASE[kind].decode(raw).items:
        utf8 = it.utf8
        if utf8 is UNSET:  # a msgpack reply carries the payload once, as bytes
            payload = it.bytes  # okq.wire.utf8_or_none, written out
            if payload and NEVER_FIRST[payload[0]]:
                utf8 = None
            else:
                try:
                    utf8 = payload.decode()
                except UnicodeDecodeError:
                    utf8 = None
        headers = it.headers
        item = _new(LeasedItemOut)
        _set_dict(item, {
            "id": it.id, "token": it.token, "attempts": it.attempts,
            "lease_deadline": it.lease_deadline, "produced_at": it.produced_at,
            "enqueue_at": it.enqueue_at, "bytes": it.bytes, "utf8": utf8, "meta": it.meta,
            "headers": {} if headers is UNSET else headers,
        })
        _set_fields_set(item, set(_NO_HEADERS_SET if headers is UNSET else _ALL_SET))
        _set_extra(item, None)
        _set_private(item, None)
        items.append(item)
    return items


def produced_ids(raw: bytes) -> list[str]:
    """The ids of a msgpack ``queue.produce`` reply; ``msgspec.DecodeError`` for a body
    that is not a produce reply."""
    return _PRODUCE.decode(raw).ids
