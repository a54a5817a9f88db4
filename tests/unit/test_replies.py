"""The client's cheap reading of lease and produce replies (okq.replies) against full
validation by the wire models: the same values, types and behaviour of the items."""

from __future__ import annotations

import copy
from datetime import UTC, timedelta
from types import TracebackType
from typing import Any

import msgpack
import msgspec
import pytest

from okq import replies
from okq import wire as s
from okq.client import Client
from okq.errors import OkqError
from okq.headers import split_meta
from okq.leases import LeasedItem
from okq.server.codec import lease_reply_plain

T0 = 1_764_669_600_123


def engine_items() -> list[LeasedItem]:
    """What the engine says of leased items (``okq.wire.Leased``), in every shape the
    wire shows: text and binary payloads, with and without meta and enqueue_at."""
    shapes = [
        (b"hello", None, None),
        (b"\xff\xfe not utf-8", None, T0 - 5000),
        (b"", {"source_queue": "q", "attempts": 3, "origin": ["01ID", T0 - 9000]}, None),
        ("caf\u00e9 \u2603".encode(), {"nested": {"k": [1, 2.5, None, b"\x00"]}}, T0 + 1),
        (b"x" * 1024, None, None),
        (b"with headers", {"headers": {"a": "1", "b": "\u00e9"}}, None),
        (b"sqs", {"sqs": {"attrs": {"s": ["String", "v"], "n": ["Number", "1"]}},
                  "headers": {"h": "x"}}, None),
    ]
    return [LeasedItem(f"{n:026d}", "q", f"v1.token{n}", n + 1, T0 + 30_000, payload,
                       T0 - n * 7, enqueue, meta)
            for n, (payload, meta, enqueue) in enumerate(shapes)]


def msgpack_reply(items: list[Any]) -> bytes:
    """A lease reply as the node sends it on msgpack (okq.server.handlers.lease)."""
    return lease_reply_plain("q", items)


def plain(item: Any) -> dict[str, Any]:
    """One leased item as the node's msgpack reply carries it, as a dict."""
    return dict(msgpack.unpackb(lease_reply_plain("q", [item]))["items"][0])


def json_reply(items: list[Any]) -> bytes:
    """A lease reply as the node sends it on JSON (okq.server.codec.respond)."""
    reply = s.LeaseResponse(queue_name="q", items=[s.leased_item_out(i) for i in items])
    return reply.model_dump_json().encode()


def validated_msgpack(raw: bytes) -> list[s.LeasedItemOut]:
    """The reading before okq.replies: full validation, then utf8 filled in."""
    items = s.LeaseResponse.model_validate(msgpack.unpackb(raw, raw=False)).items
    for item in items:
        if item.utf8 is None:
            item.utf8 = strict_utf8(item.bytes)
    return items


def strict_utf8(payload: bytes) -> str | None:
    """What ``utf8`` is by definition: the payload decoded, if it is UTF-8."""
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return None


FIELDS = list(s.LeasedItemOut.model_fields)


def assert_same(got: list[s.LeasedItemOut], want: list[s.LeasedItemOut]) -> None:
    assert len(got) == len(want) == len(engine_items())
    for g, w in zip(got, want, strict=True):
        assert type(g) is s.LeasedItemOut
        for name in FIELDS:
            assert getattr(g, name) == getattr(w, name), name
            assert type(getattr(g, name)) is type(getattr(w, name)), name
        for name in ("lease_deadline", "produced_at", "enqueue_at"):
            when = getattr(g, name)
            if when is not None:
                assert when.utcoffset() == timedelta(0), name
        assert g == w
        assert g.model_dump() == w.model_dump()
        assert g.model_dump_json() == w.model_dump_json()
        # every field, but headers when the reply left them out (msgpack, none)
        assert g.model_fields_set == w.model_fields_set
        assert g.model_fields_set | {"headers"} == set(FIELDS)


@pytest.mark.parametrize("kind", ["msgpack", "json"])
def test_items_equal_full_validation(kind: str) -> None:
    engine = engine_items()
    if kind == "msgpack":
        raw = msgpack_reply(engine)
        want = validated_msgpack(raw)
    else:
        raw = json_reply(engine)
        want = s.LeaseResponse.model_validate_json(raw).items
    got = replies.leased_items(raw, kind)
    assert_same(got, want)
    assert [i.utf8 for i in got] == ["hello", None, "", "caf\u00e9 \u2603", "x" * 1024,
                                     "with headers", "sqs"]
    assert [i.headers for i in got] == [{}, {}, {}, {}, {}, {"a": "1", "b": "\u00e9"},
                                        {"s": "v", "h": "x"}]
    assert got[5].meta is None  # the headers are not repeated in meta
    assert got[6].meta == {"sqs": {"attrs": {"s": ["String", "v"], "n": ["Number", "1"]}}}
    assert got[1].enqueue_at == s.to_datetime(T0 - 5000)
    assert got[0].enqueue_at is None
    assert got[2].meta == {"source_queue": "q", "attempts": 3, "origin": ["01ID", T0 - 9000]}
    assert got[3].meta == {"nested": {"k": [1, 2.5, None, b"\x00"]}} if kind == "msgpack" \
        else got[3].meta == want[3].meta
    assert got[0].lease_deadline == s.to_datetime(T0 + 30_000)
    assert got[0].lease_deadline.tzinfo is not None
    assert got[4].produced_at == s.to_datetime(T0 - 28).astimezone(UTC)


def test_items_behave_as_models() -> None:
    """Each item is a whole pydantic model: assignment, copies, pickling-style copies."""
    item = replies.leased_items(msgpack_reply(engine_items()))[1]
    again = item.model_copy()
    assert again == item
    assert copy.deepcopy(item) == item
    item.utf8 = "set by a user"
    assert item.utf8 == "set by a user"
    assert again.utf8 is None  # copies do not share their fields
    assert s.LeasedItemOut.model_validate(item.model_dump()).bytes == item.bytes
    assert "LeasedItemOut(id=" in repr(item)


def test_reply_without_optional_keys_and_with_unknown_ones() -> None:
    """A reply that leaves out what has a default, or adds a key (a newer node), reads
    as validation reads the former and skips the latter."""
    item = plain(engine_items()[0])
    del item["enqueue_at"], item["meta"]
    raw = msgpack.packb({"queue_name": "q", "items": [item]}, use_bin_type=True)
    [got] = replies.leased_items(raw)
    [want] = validated_msgpack(raw)
    assert got == want and got.enqueue_at is None and got.meta is None
    item["shiny_new_field"] = 1
    raw = msgpack.packb({"queue_name": "q", "items": [item], "more": True}, use_bin_type=True)
    [got] = replies.leased_items(raw)
    assert got == want and "shiny_new_field" not in got.model_dump()


@pytest.mark.parametrize("body", [
    b"<html>not okq</html>",
    msgpack.packb({"queue_name": "q"}),
    msgpack.packb({"queue_name": "q", "items": [{"id": "a"}]}),
    msgpack.packb({"queue_name": "q", "items": [
        {**plain(engine_items()[0]), "attempts": "1"}]}),
    msgpack.packb({"queue_name": "q", "items": [
        {**plain(engine_items()[0]), "lease_deadline": "soon"}]}),
], ids=["html", "no-items", "missing-fields", "attempts-text", "bad-time"])
def test_not_a_lease_reply(body: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        replies.leased_items(body)


def test_produced_ids() -> None:
    raw = msgpack.packb({"queue_name": "q", "ids": ["a", "b"]})
    assert replies.produced_ids(raw) == ["a", "b"]
    with pytest.raises(msgspec.DecodeError):
        replies.produced_ids(msgpack.packb({"queue_name": "q", "ids": [1]}))


# -- through the Client, on a session that answers from recorded replies ----------------------


class Answer:
    headers: dict[str, str] = {}  # noqa: RUF012

    def __init__(self, status: int, raw: bytes) -> None:
        self.status, self.raw = status, raw

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None

    async def read(self) -> bytes:
        return self.raw


class Recorded:
    """An aiohttp session stand-in: each path answers its recorded reply; the bodies
    sent are kept."""

    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, Any]] = []

    def post(self, url: object, *, data: bytes, **_: Any) -> Answer:
        path = str(url).rsplit("/", 1)[1]
        self.sent.append((path, msgpack.unpackb(data)))
        return Answer(*self.answers[path])


async def test_client_lease_and_produce() -> None:
    raw = msgpack_reply(engine_items())
    session = Recorded({"queue.lease": (200, raw),
                        "queue.produce": (200, msgpack.packb({"queue_name": "q",
                                                              "ids": ["i1", "i2", "i3"]}))})
    client = Client("http://recorded", session=session)  # type: ignore[arg-type]
    assert_same(await client.lease("q", 5), validated_msgpack(raw))
    ids = await client.produce("q", [b"raw", "text", s.ProduceItem(bytes=b"b", key="k")])
    assert ids == ["i1", "i2", "i3"]
    assert session.sent[-1] == ("queue.produce", {"queue_name": "q", "items": [
        {"bytes": b"raw"}, {"utf8": "text"}, {"bytes": b"b", "key": "k"}]})


@pytest.mark.parametrize("path", ["queue.lease", "queue.produce"])
async def test_client_names_a_reply_that_is_not_okq(path: str) -> None:
    session = Recorded({path: (200, b"<html>welcome</html>")})
    client = Client("http://recorded", session=session)  # type: ignore[arg-type]
    with pytest.raises(OkqError, match="HTTP 200 with a reply that is not an okq reply") as err:
        if path == "queue.lease":
            await client.lease("q", 5)
        else:
            await client.produce("q", [b"x"])
    assert err.value.details.get("not_okq") is True


def test_a_reply_from_a_newer_node_with_fields_this_client_does_not_know_is_read() -> None:
    """Replies read by their wire model ignore unknown fields, at the top and in nested
    items, so an older client keeps working when a node adds a field to a reply;
    requests still refuse them, so a typo in a request names its field."""
    from okq.client import _validated

    item = {"id": "01ID", "state": "available", "attempts": 0, "produced_at": T0 / 1000,
            "ready_at": T0 / 1000, "bytes": b"x", "added_later": {"any": "thing"}}
    body = {"queue_name": "q", "items": [item], "next_start_after": None, "also_later": 1}
    got = _validated(s.ItemsListResponse)(msgpack.packb(body, use_bin_type=True))
    assert [i.id for i in got.items] == ["01ID"]
    assert not hasattr(got, "also_later") and not hasattr(got.items[0], "added_later")
    with pytest.raises(ValueError, match="also_later"):
        s.ItemsListRequest.model_validate({"queue_name": "q", "also_later": 1})


@pytest.mark.parametrize("duplicates", [None, 0, 3])
def test_a_produce_reply_is_the_bytes_its_model_makes(duplicates: int | None) -> None:
    """The node's msgpack produce reply skips the model: the same bytes as
    ``respond`` makes of ``ProduceResponse``, with a ``Produced`` list of ids."""
    from okq.publisher import Produced
    from okq.server.codec import _plain

    ids = Produced([f"018b5e3c2a00-0123456789.{n}" for n in range(300)], duplicates or 0)
    model = s.ProduceResponse.model_construct(queue_name="q", ids=ids, duplicates=duplicates)
    assert s.produce_reply_plain("q", ids, duplicates) == msgpack.packb(
        _plain(model.model_dump()), use_bin_type=True)


def leased_item_plain(i: LeasedItem) -> s.LeasedItemPlain:
    """What a msgpack lease reply says of a leased item, one item alone: the
    reference ``okq.leases.reply_rows`` is held to."""
    meta, headers = split_meta(i.meta) if i.meta else (i.meta, None)
    return s.LeasedItemPlain(
        i.id, i.token, i.attempts, s.iso_time(i.lease_deadline_ms), s.iso_time(i.produced_ms),
        None if i.enqueue_at_ms is None else s.iso_time(i.enqueue_at_ms), i.payload, meta,
        headers or None)


def test_a_lease_reply_is_each_items_plain_struct() -> None:
    """The reply's loop writes ``leased_item_plain`` out, spelling a time once per run
    of items that share it: the same bytes, whatever the times of neighbours."""
    items = engine_items() + engine_items()[::-1]
    items[3].lease_deadline_ms += 1  # a deadline that differs from its neighbours'
    want = msgspec.msgpack.encode(s.LeaseReplyPlain("q", [leased_item_plain(i) for i in items]))
    assert lease_reply_plain("q", items) == want


# Tails that make a valid sequence of every length after a lead byte, and some that do not.
TAILS = [b"", b"a", b"\x80", b"\x80\x80", b"\x80\x80\x80", b"\xa0\x80", b"\x90\x80\x80",
         b"\xbf\xbf\xbf", b"\xc3\xa9 text", b"\xff"]


def test_utf8_is_the_strict_decoding_whatever_the_first_byte() -> None:
    """``utf8`` skips the decode for a first byte no UTF-8 text begins with: for every
    first byte and tail, it is the payload decoded strictly or None, on both paths."""
    payloads = [bytes([first]) + tail for first in range(256) for tail in TAILS]
    first = engine_items()[0]
    items = [LeasedItem(first.id, first.queue, first.token, first.attempts,
                        first.lease_deadline_ms, payload, first.produced_ms)
             for payload in payloads]
    got = replies.leased_items(msgpack_reply(items))
    assert [i.utf8 for i in got] == [strict_utf8(p) for p in payloads]
    assert [s.utf8_or_none(p) for p in payloads] == [strict_utf8(p) for p in payloads]
    assert sum(strict_utf8(p) is not None for p in payloads) > 256  # both kinds are here
