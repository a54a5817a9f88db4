"""State objects and their msgpack codec (okq/model.py), and QueueConfig validation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from okq.errors import FormatError, InvalidRequest
from okq.leases import (
    DEAD,
    DEAD_PENDING,
    DONE,
    LEASED,
    OUTPUTS_PENDING,
    WAITING,
    ItemState,
    LeaseObject,
    decode_lease,
    encode_lease,
)
from okq.model import (
    Chunk,
    Manifest,
    QueueConfig,
    Segment,
    SegmentItem,
    SegmentMeta,
    decode_chunk,
    decode_manifest,
    decode_segment,
    encode_chunk,
    encode_manifest,
    encode_segment,
    fresh_due_ms,
    fresh_ready_ms,
    new_nonce,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
UINT = st.integers(0, 2**53)
# JSON-like values survive msgpack unchanged (tuples would come back as lists)
SCALARS = st.one_of(
    st.none(), st.booleans(), INT64, st.floats(allow_nan=False), st.text(), st.binary()
)
META_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
METAS = st.one_of(st.none(), st.dictionaries(st.text(max_size=10), META_VALUES, max_size=5))

CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any], Any]] = {
    "manifest": (
        encode_manifest,
        decode_manifest,
        Manifest("q", 1, QueueConfig(), ver=1, nonce="n"),
    ),
    "segment": (encode_segment, decode_segment, Segment("s", "q", 1, 2, [])),
    "lease": (encode_lease, decode_lease, LeaseObject("s")),
    "mchunk": (lambda c: encode_chunk("q", c), decode_chunk,
               Chunk("018b5e3c2a00-0123456789", [SegmentMeta("s", 1, 2, 3)])),
}


# -- round trips ------------------------------------------------------------------


def test_manifest_round_trip() -> None:
    m = Manifest(
        queue="orders",
        created_ms=1_700_000_000_000,
        config=QueueConfig(
            lease_timeout=2.5,
            retention=60,
            max_attempts=3,
            dead_queue="dlq",
            retention_dead_letter=True,
        ),
        segments=[
            SegmentMeta("018b5e3c2a00-0123456789", 10, 1_700_000_000_000, 4096),
            SegmentMeta("018b5e3c2a01-0123456789", 3, 1_700_000_000_001, 99, 1_600_000_000_000),
        ],
        idem={"key-1": ["018b5e3c2a00-0123456789.3", 1_700_000_600_000]},
        produced=10,
        gc_floor_ms=1_699_999_000_000,
        ver=7,
        nonce=new_nonce(),
    )
    assert decode_manifest(encode_manifest(m)) == m


@given(
    queue=st.text(min_size=1, max_size=20),
    created=UINT,
    segs=st.lists(
        st.tuples(st.text(max_size=24), UINT, UINT, UINT, st.one_of(st.none(), UINT)),
        max_size=5,
    ),
    idem=st.dictionaries(st.text(max_size=10), st.tuples(st.text(max_size=24), UINT), max_size=5),
    produced=UINT,
    floor=UINT,
    ver=UINT,
    nonce=st.text(max_size=16),
    lease_timeout=st.floats(0.1, 43_200),
    max_attempts=st.integers(0, 10_000),
    dead_letter=st.booleans(),
)
def test_manifest_round_trip_any(
    queue: str,
    created: int,
    segs: list[tuple[str, int, int, int, int | None]],
    idem: dict[str, tuple[str, int]],
    produced: int,
    floor: int,
    ver: int,
    nonce: str,
    lease_timeout: float,
    max_attempts: int,
    dead_letter: bool,
) -> None:
    m = Manifest(
        queue,
        created,
        QueueConfig(
            lease_timeout=lease_timeout,
            max_attempts=max_attempts,
            retention_dead_letter=dead_letter,
        ),
        [SegmentMeta(*s) for s in segs],
        {k: list(v) for k, v in idem.items()},
        produced,
        floor,
        ver,
        nonce,
    )
    assert decode_manifest(encode_manifest(m)) == m


@given(
    items=st.lists(
        st.builds(
            SegmentItem,
            st.binary(max_size=200),
            st.one_of(st.none(), UINT),
            METAS,
            st.one_of(st.none(), UINT),
        ),
        max_size=8,
    ),
    created=UINT,
    publish_by=UINT,
)
def test_segment_round_trip(items: list[SegmentItem], created: int, publish_by: int) -> None:
    s = Segment("018b5e3c2a00-0123456789", "orders", created, publish_by, items)
    back = decode_segment(encode_segment(s))
    assert back == s
    assert all(isinstance(i.payload, bytes) for i in back.items)


def test_segment_payload_stays_bytes_even_if_it_is_utf8() -> None:
    s = Segment("s", "q", 1, 2, [SegmentItem(b"hello", None, {"k": b"v", "t": "v"})])
    back = decode_segment(encode_segment(s))
    assert back.items[0].payload == b"hello"
    assert back.items[0].meta == {"k": b"v", "t": "v"}


STATES = st.builds(
    ItemState,
    st.sampled_from([LEASED, WAITING, DONE, DEAD_PENDING, DEAD, OUTPUTS_PENDING]),
    UINT,
    UINT,
    UINT,
    st.one_of(st.none(), st.text(max_size=40)),
    st.one_of(st.none(), st.tuples(st.text(max_size=8), st.text(max_size=24), UINT).map(list)),
    st.one_of(st.none(), st.text(max_size=12)),
    st.one_of(st.none(), UINT),
)


@given(
    items=st.dictionaries(st.integers(0, 100_000), STATES, max_size=10),
    ver=UINT,
    nonce=st.text(max_size=16),
    sealed=st.booleans(),
)
def test_lease_object_round_trip(
    items: dict[int, ItemState], ver: int, nonce: str, sealed: bool
) -> None:
    o = LeaseObject("018b5e3c2a00-0123456789", items, ver, nonce, sealed)
    back = decode_lease(encode_lease(o))
    assert back == o
    assert all(isinstance(i, int) for i in back.items)


def test_optional_fields_are_left_out_when_unset() -> None:
    """Objects without the later, optional fields keep their shorter shape."""
    meta = SegmentMeta("s", 1, 2, 3)
    assert meta.pack() == ["s", 1, 2, 3]
    assert SegmentMeta.unpack(["s", 1, 2, 3]) == meta
    assert ItemState(DONE, 1, 1, 5).pack() == [DONE, 1, 1, 5, None]
    seg = Segment("s", "q", 1, 2, [SegmentItem(b"p")])
    raw = msgpack.unpackb(encode_segment(seg))
    assert raw["items"] == [[b"p", None, None]]


def test_first_lease_time_is_a_trailing_field_older_readers_skip() -> None:
    """``first`` comes last, after nil placeholders; a reader that knows only the
    first seven fields (an older okq) still decodes the state it needs."""
    state = ItemState(LEASED, 2, 1, 500, None, first=100)
    assert state.pack() == [LEASED, 2, 1, 500, None, None, None, 100]
    assert ItemState.unpack(state.pack()) == state
    older = state.pack()[:7]
    assert ItemState.unpack(older) == ItemState(LEASED, 2, 1, 500, None)


def test_manifest_keeps_attributes_only_when_there_are_some() -> None:
    """An okq without ``attributes`` refuses unknown config fields, so a manifest
    without any keeps the older shape."""
    plain = Manifest("q", 1, QueueConfig(), ver=1, nonce="n")
    assert "attributes" not in msgpack.unpackb(encode_manifest(plain))["config"]
    tagged = Manifest("q", 1, QueueConfig(attributes={"DelaySeconds": "5", "tag:team": "a"}),
                      ver=1, nonce="n")
    raw = msgpack.unpackb(encode_manifest(tagged))
    assert raw["config"]["attributes"] == {"DelaySeconds": "5", "tag:team": "a"}
    assert decode_manifest(encode_manifest(tagged)).config == tagged.config


def test_segment_meta_first_ready() -> None:
    assert SegmentMeta("s", 1, 1_000, 3).first_ready_ms == 1_000
    assert SegmentMeta("s", 1, 1_000, 3, 400).first_ready_ms == 400


@pytest.mark.parametrize(
    ("born", "enqueue_at", "ready"),
    [
        (None, None, 1_000),
        (None, 500, 1_000),
        (None, 2_000, 2_000),
        (300, None, 300),
        (300, 700, 700),
        (300, 0, 300),
    ],
)
def test_fresh_ready_ms(born: int | None, enqueue_at: int | None, ready: int) -> None:
    sm = SegmentMeta("s", 1, 1_000, 3)
    assert fresh_ready_ms(sm, SegmentItem(b"", enqueue_at, None, born)) == ready


_MS = st.integers(min_value=0, max_value=2_000)


@given(created=_MS, items=st.lists(st.tuples(st.none() | _MS, st.none() | _MS), max_size=12))
def test_a_segments_fresh_candidates_are_its_items_ready_and_due_times(
        created: int, items: list[tuple[int | None, int | None]]) -> None:
    """The lease walk's candidates of a never-leased segment (written out for speed),
    sorted."""
    from okq.scheduler import _fresh

    seg = Segment("s", "q", created, created,
                  [SegmentItem(b"", at, None, born) for born, at in items] + [SegmentItem(b"")])
    sm = SegmentMeta("s", len(items), created, 3)  # the last item is past the count
    assert _fresh(sm, seg) == sorted((fresh_ready_ms(sm, item), n, fresh_due_ms(sm, item))
                                     for n, item in enumerate(seg.items[:len(items)]))


def test_new_nonce_is_random_hex() -> None:
    a, b = new_nonce(), new_nonce()
    assert a != b
    assert len(a) == 16 and int(a, 16) >= 0


# -- refusing bad bytes -------------------------------------------------------------


def _raw(kind: str) -> dict[str, Any]:
    encode, _, sample = CODECS[kind]
    raw: dict[str, Any] = msgpack.unpackb(encode(sample), strict_map_key=False)
    return raw


def _refuses(decode: Callable[[bytes], Any], data: bytes, words: str | None = None) -> FormatError:
    with pytest.raises(FormatError, match=words) as info:
        decode(data)
    assert info.value.data == data
    assert info.value.code == "format_error"
    return info.value


@pytest.mark.parametrize("kind", sorted(CODECS))
@pytest.mark.parametrize(
    "garbage",
    [b"", b"\xc1", b"\x93\x01\x02", b"\x01", b"hello", b"\xde\xad\xbe\xef", b"\x81\xa1f"],
    ids=["empty", "reserved-byte", "array", "int", "text", "deadbeef", "truncated-map"],
)
def test_garbage_is_a_format_error_that_keeps_the_bytes(kind: str, garbage: bytes) -> None:
    _refuses(CODECS[kind][1], garbage)


@given(data=st.binary(max_size=64))
def test_random_bytes_never_decode_silently_wrong(data: bytes) -> None:
    for encode, decode, _ in CODECS.values():
        try:
            obj = decode(data)
        except FormatError as exc:
            assert exc.data == data
        else:  # pragma: no cover - only a real encoding decodes
            assert encode(obj)


@pytest.mark.parametrize(
    ("kind", "other"), [(k, o) for k in sorted(CODECS) for o in sorted(CODECS) if k != o]
)
def test_wrong_kind_is_refused(kind: str, other: str) -> None:
    data = CODECS[other][0](CODECS[other][2])
    _refuses(CODECS[kind][1], data, f"expected a {kind} object")


@pytest.mark.parametrize("kind", sorted(CODECS))
def test_missing_kind_is_refused(kind: str) -> None:
    raw = _raw(kind)
    del raw["f"]
    _refuses(CODECS[kind][1], msgpack.packb(raw), f"expected a {kind} object")


@pytest.mark.parametrize("kind", sorted(CODECS))
@pytest.mark.parametrize("version", [0, 3, 99, "1", None])
def test_wrong_version_is_refused(kind: str, version: object) -> None:
    raw = _raw(kind)
    raw["v"] = version
    _refuses(CODECS[kind][1], msgpack.packb(raw), "unsupported .* format version")


@pytest.mark.parametrize("kind", sorted(CODECS))
def test_missing_version_is_refused(kind: str) -> None:
    raw = _raw(kind)
    del raw["v"]
    _refuses(CODECS[kind][1], msgpack.packb(raw), "unsupported")


@pytest.mark.parametrize("kind", sorted(CODECS))
def test_missing_field_is_refused(kind: str) -> None:
    raw = _raw(kind)
    del raw[{"segment": "publish_by", "mchunk": "segments"}.get(kind, "ver")]
    _refuses(CODECS[kind][1], msgpack.packb(raw), "malformed")


def test_lease_object_without_sealed_decodes_unsealed() -> None:
    raw = _raw("lease")
    del raw["sealed"]
    assert CODECS["lease"][1](msgpack.packb(raw)).sealed is False


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("manifest", "segments", [[1, 2]]),
        ("manifest", "segments", [5]),
        ("manifest", "config", {"lease_timeout": -1}),
        ("manifest", "config", {"unknown": 1}),
        ("segment", "items", [[]]),
        ("segment", "items", [[b"p", None, None, 1, 2, 3]]),
        ("segment", "items", [5]),
        ("segment", "items", 5),
        ("lease", "items", {0: ["L", 1]}),
        ("lease", "items", {"x": ["L", 1, 1, 1, None]}),
        ("lease", "items", {0: 5}),
    ],
)
def test_malformed_body_is_refused(kind: str, field: str, value: object) -> None:
    raw = _raw(kind)
    if value is ...:
        del raw[field]
    else:
        raw[field] = value
    _refuses(CODECS[kind][1], msgpack.packb(raw), "malformed")


@pytest.mark.parametrize("value", [[], "x", 5, None])
def test_lease_items_that_are_not_a_map_are_refused(value: object) -> None:
    raw = _raw("lease")
    raw["items"] = value
    _refuses(decode_lease, msgpack.packb(raw), "malformed")


def test_manifest_with_a_bad_stored_dead_queue_is_a_format_error() -> None:
    raw = _raw("manifest")
    raw["config"] = {"dead_queue": "bad name"}
    _refuses(decode_manifest, msgpack.packb(raw), "malformed")


# -- QueueConfig ---------------------------------------------------------------------


def test_config_defaults() -> None:
    c = QueueConfig()
    assert (c.lease_timeout, c.retention, c.max_attempts, c.dead_queue) == (30.0, 345_600, 0, None)
    assert c.retention_dead_letter is False
    assert c.lease_ms == 30_000


def test_lease_ms_is_integer_milliseconds() -> None:
    assert QueueConfig(lease_timeout=0.1).lease_ms == 100
    assert QueueConfig(lease_timeout=1.2345).lease_ms == 1234


@pytest.mark.parametrize(
    ("field", "ok", "bad"),
    [
        ("lease_timeout", [0.1, 43_200], [0.09, 0, -1, 43_200.01]),
        ("retention", [1, 1_209_600], [0.5, 0, 1_209_601]),
        ("max_attempts", [0, 10_000], [-1, 10_001, 1.5]),
    ],
)
def test_config_bounds(field: str, ok: list[float], bad: list[float]) -> None:
    for value in ok:
        assert getattr(QueueConfig.model_validate({field: value}), field) == value
    for value in bad:
        with pytest.raises(ValidationError) as info:
            QueueConfig.model_validate({field: value})
        assert info.value.errors()[0]["loc"] == (field,)


def test_config_refuses_extra_fields() -> None:
    with pytest.raises(ValidationError) as info:
        QueueConfig.model_validate({"lease_timeout": 5, "visibility": 10})
    assert info.value.errors()[0]["type"] == "extra_forbidden"
    assert info.value.errors()[0]["loc"] == ("visibility",)


def test_config_accepts_a_valid_dead_queue() -> None:
    assert QueueConfig(dead_queue="orders.dlq-1_x").dead_queue == "orders.dlq-1_x"


@pytest.mark.parametrize("name", ["", "bad name", "-leading", "a/b", "x" * 129, "é"])
def test_config_refuses_a_bad_dead_queue_name(name: str) -> None:
    # check_name raises InvalidRequest, which pydantic lets through unwrapped
    with pytest.raises(InvalidRequest) as info:
        QueueConfig(dead_queue=name)
    assert info.value.field == "dead_queue"


def test_config_round_trips_through_model_dump() -> None:
    c = QueueConfig(
        lease_timeout=3, retention=10, max_attempts=2, dead_queue="dlq", retention_dead_letter=True
    )
    assert QueueConfig.model_validate(c.model_dump()) == c


def test_lease_objects_encode_as_one_map_whatever_the_cached_states() -> None:
    """encode_lease joins each state's cached bytes: the result is exactly the
    generic encoding, also once states were cached, replaced, or share an object
    under two indexes, and for maps of every header size."""
    import random
    from dataclasses import replace

    from okq.model import pack_object as _pack

    def generic(o: LeaseObject) -> bytes:
        return _pack("lease", {"segment": o.segment,
                               "items": {i: st.pack() for i, st in o.items.items()},
                               "ver": o.ver, "nonce": o.nonce, "sealed": o.sealed})

    rng = random.Random(7)
    for n in (0, 1, 15, 16, 4095, 4097, 70_000):
        o = LeaseObject("seg", ver=n, nonce="n", sealed=n % 2 == 1)
        for i in range(n):
            o.items[i] = ItemState(rng.choice("LWDXZP"), i, 1, 1_700_000_000_000 + i,
                                   "boom" if i % 7 == 0 else None,
                                   ["q", "s", 1, 2, 3] if i % 11 == 0 else None,
                                   "rq" if i % 5 == 0 else None)
        assert encode_lease(o) == generic(o)
        assert encode_lease(o) == generic(o)  # now from the cached bytes
        if n:
            o.items[0] = replace(o.items[0], t=1)  # a new state: packed afresh
            o.items[n] = o.items[n - 1]  # one state object under two indexes
        assert encode_lease(o) == generic(o)
        assert decode_lease(encode_lease(o)).items == o.items
