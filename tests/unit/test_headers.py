"""Item headers (okq/headers.py): what the native API accepts, as a 400 naming the
field; where an item's meta keeps them and how the native and SQS views of one item
agree; the client's items (dicts, and a lone payload refused)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack
import pytest

from okq import wire as s
from okq.client import _items
from okq.errors import InvalidRequest
from okq.headers import headers_of, split_meta, with_headers
from okq.limits import MAX_HEADERS, MAX_HEADERS_BYTES
from okq.publisher import NewItem
from okq.runtime import EngineOptions
from okq.server.codec import lease_reply_plain
from okq.server.handlers import _validate
from okq.sqs import messages as msg


def produce_error(headers: Any, **item: Any) -> InvalidRequest:
    body = {"queue_name": "q", "items": [{"utf8": "x", "headers": headers, **item}]}
    with pytest.raises(InvalidRequest) as caught:
        _validate(body, s.ProduceRequest)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("headers, words", [
    ({f"h{n}": "v" for n in range(MAX_HEADERS + 1)}, "holds 11 headers; the limit is 10"),
    ({"a": "x" * MAX_HEADERS_BYTES}, f"the limit is {MAX_HEADERS_BYTES}"),
    ({"n": 5}, "header 'n' must be a non-empty string"),
    ({"n": None}, "header 'n' must be a non-empty string"),
    ({"n": ["v"]}, "header 'n' must be a non-empty string"),
    ({"n": ""}, "header 'n' must be a non-empty string"),
    ({"n": "bell\x07"}, "control character"),
    ({"two words": "v"}, "'two words' is not a header name"),
    ({"AWS.thing": "v"}, "is not a header name"),
    ({"a..b": "v"}, "is not a header name"),
    ({"": "v"}, "is not a header name"),
    (["a", "b"], "must be an object of string names to string values"),
    ("k=v", "must be an object"),
])
def test_bad_headers_are_a_400_naming_the_field(headers: Any, words: str) -> None:
    err = produce_error(headers)
    assert err.details["field"] == "items[0].headers"
    assert words in err.message


def test_good_headers_at_the_limits() -> None:
    most = {f"h{n}": "v" for n in range(MAX_HEADERS)}
    body = s.ProduceRequest.model_validate({"queue_name": "q", "items": [
        {"utf8": "x", "headers": most},
        {"utf8": "y", "headers": {"a": "é" * ((MAX_HEADERS_BYTES - 1) // 2)}},
        {"utf8": "z", "headers": {}}, {"utf8": "w", "headers": None}]})
    assert body.items[0].headers == most
    assert body.items[2].headers is None and body.items[3].headers is None  # none: no meta


def test_delay_or_enqueue_at() -> None:
    err = produce_error(None, delay=5, enqueue_at="2030-01-01T00:00:00Z")
    assert "at most one of 'enqueue_at' and 'delay'" in err.message
    assert produce_error(None, delay=-1).details["field"] == "items[0].delay"


def test_library_mode_checks_headers_in_meta() -> None:
    """Engine.produce takes NewItem(meta=...): headers there obey the same rules."""
    from okq.clock import SystemClock
    from okq.runtime import Runtime
    from okq.store import MemoryStore

    rt = Runtime(MemoryStore(), "ns", SystemClock(), EngineOptions())
    good = NewItem(b"x", meta=with_headers(None, {"a": "1"}))
    assert rt.new_items([good], "items") == [good]
    with pytest.raises(InvalidRequest) as caught:
        rt.new_items([good, NewItem(b"y", meta={"headers": {"a": 1}})], "items")
    assert caught.value.details["field"] == "items[1].headers"


# -- where they are kept, and the two views of one item ------------------------------------

SQS_META = {"sqs": {"attrs": {"s": ["String", "from sqs"], "n": ["Number", "5"],
                              "c": ["String.custom", "typed"], "b": ["Binary", "AAE="]},
                    "sender": "AKID"}}


def test_native_headers_are_kept_in_meta_and_shown_beside_it() -> None:
    meta = with_headers({"source_queue": "q"}, {"a": "1"})
    assert meta == {"source_queue": "q", "headers": {"a": "1"}}
    assert split_meta(meta) == ({"source_queue": "q"}, {"a": "1"})
    assert split_meta(with_headers(None, {"a": "1"})) == (None, {"a": "1"})
    assert with_headers(None, {}) is None and split_meta(None) == (None, {})


def test_sqs_string_attributes_are_headers() -> None:
    """Only type String: a custom String.x, Number and Binary stay typed in meta."""
    assert headers_of(SQS_META) == {"s": "from sqs"}
    meta, headers = split_meta(SQS_META)
    assert meta == SQS_META and headers == {"s": "from sqs"}


def test_native_headers_are_sqs_string_attributes() -> None:
    attrs = msg.message_attributes(with_headers(None, {"a": "1", "b": "two"}))
    assert attrs == {"a": msg.Attribute("String", "1"), "b": msg.Attribute("String", "two")}
    both = msg.message_attributes({**SQS_META, "headers": {"s": "native", "h": "x"}})
    assert both["s"] == msg.Attribute("String", "from sqs")  # SQS's typed one wins
    assert both["h"] == msg.Attribute("String", "x") and both["b"].value == b"\x00\x01"
    assert msg.message_attributes(None) == {}


def test_engine_items_show_headers() -> None:
    from okq.leases import LeasedItem

    item = LeasedItem("i", "q", "t", 1, 1, b"p", 1, meta={**SQS_META, "headers": {"a": "1"}})
    assert item.headers == {"a": "1", "s": "from sqs"}
    assert LeasedItem("i", "q", "t", 1, 1, b"p", 1).headers == {}


def test_wire_items_show_headers_and_meta_without_them() -> None:
    from okq.leases import LeasedItem

    leased = LeasedItem("i", "q", "t", 1, 1, b"p", 1, meta={**SQS_META, "headers": {"a": "1"}})
    out = s.leased_item_out(leased)
    assert out.headers == {"a": "1", "s": "from sqs"} and out.meta == SQS_META
    plain = msgpack.unpackb(lease_reply_plain("q", [leased]))["items"][0]
    assert plain["headers"] == out.headers and plain["meta"] == SQS_META
    leased.meta = None
    assert "headers" not in msgpack.unpackb(lease_reply_plain("q", [leased]))["items"][0]
    assert s.leased_item_out(leased).headers == {}


# -- the client's items -------------------------------------------------------------------


@pytest.mark.parametrize("items", ["abc", b"abc", bytearray(b"abc"), {"payload": "abc"},
                                   s.ProduceItem(utf8="abc")])
def test_client_refuses_a_lone_item(items: Any) -> None:
    with pytest.raises(TypeError, match=r"items must be a list of items, not a .*\[item\]"):
        _items(items)


def test_client_dict_items() -> None:
    at = datetime(2030, 1, 1, 12)
    got = _items([{"payload": b"\x00", "headers": {"a": "1"}, "key": "k", "delay": 2.5},
                  {"payload": "text", "enqueue_at": at}, b"raw", "str", bytearray(b"ba")])
    assert got == [{"bytes": b"\x00", "headers": {"a": "1"}, "key": "k", "delay": 2.5},
                   {"utf8": "text", "enqueue_at": at.replace(tzinfo=UTC)},
                   {"bytes": b"raw"}, {"utf8": "str"}, {"bytes": b"ba"}]
    aware = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(hours=1)
    assert _items([{"payload": "x", "enqueue_at": aware}])[0]["enqueue_at"] is aware


@pytest.mark.parametrize("item, words", [
    ({"payload": "x", "header": {}}, "unknown item key 'header'"),
    ({"headers": {}}, "payload must be bytes or str, not NoneType"),
    ({"payload": 5}, "payload must be bytes or str, not int"),
    ({"payload": "x", "enqueue_at": "2030-01-01"}, "enqueue_at must be a datetime"),
    (5, "an item is bytes, str, a dict or a ProduceItem, not int"),
])
def test_client_refuses_bad_items(item: Any, words: str) -> None:
    with pytest.raises(TypeError, match=words):
        _items([item])
