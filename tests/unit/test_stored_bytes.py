"""Objects as the store keeps them, byte for byte.

A node of one version reads what a node of another wrote, and an ETag is the MD5
of the bytes: a change to a codec that changes a single byte of an object already
written is a format change (a new ``v``), never a refactoring. These pins hold
lease objects (every item state, the optional fields, every map header size),
a segment and a manifest to the bytes okq writes today.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    FORMAT_VERSION,
    Manifest,
    QueueConfig,
    Segment,
    SegmentItem,
    SegmentMeta,
    decode_manifest,
    decode_segment,
    encode_manifest,
    encode_segment,
)

#: Each test runs on the pure and the compiled hot path (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_path")

T = 1_700_000_000_000
SEG = "018b5e3c2a00-0123456789"


def one_of_each_state() -> LeaseObject:
    return LeaseObject(SEG, {
        0: ItemState(LEASED, 1, 1, T + 30_000, None, rq="a1b2c3d4", first=T),
        1: ItemState(WAITING, 2, 2, T + 60_000, "boom", rq="rq2", first=T - 1_000_000),
        2: ItemState(DONE, 1, 1, T + 500, None),
        3: ItemState(OUTPUTS_PENDING, 3, 3, T + 1_000, None,
                     ["out", "018b5e3c2a01-abcdefabcd", 2, T + 1_000, 512]),
        7: ItemState(DEAD_PENDING, 4, 3, T + 2_000, "too many", rq="rq3"),
        9: ItemState(DEAD, 5, 3, T + 3_000, "retention expired"),
    }, ver=12, nonce="0123456789abcdef", sealed=False)


ONE_OF_EACH_STATE = bytes.fromhex(
    "87a166a56c65617365a17601a77365676d656e74b73031386235653363326130302d30313233343536373839"
    "a56974656d73860098a14c0101cf0000018bcfe5dd30c0c0a86131623263336434cf0000018bcfe568000198"
    "a1570202cf0000018bcfe65260a4626f6f6dc0a3727132cf0000018bcfd625c00295a1440101cf0000018bcf"
    "e569f4c00396a1500303cf0000018bcfe56be8c095a36f7574b73031386235653363326130312d6162636465"
    "666162636402cf0000018bcfe56be8cd02000797a1580403cf0000018bcfe56fd0a8746f6f206d616e79c0a3"
    "7271330995a15a0503cf0000018bcfe573b8b1726574656e74696f6e2065787069726564a37665720ca56e6f"
    "6e6365b030313233343536373839616263646566a67365616c6564c2"
)


def wide_and_sealed() -> LeaseObject:
    """A map of more than 15 entries (a map16 header), indexes past the cached
    key bytes (4,096) and past 65,535, a sealed segment."""
    obj = LeaseObject("018b5e3c2a00-fedcba9876", ver=3, nonce="fedcba9876543210", sealed=True)
    for i in [*range(20), 4095, 4096, 70_000]:
        obj.items[i] = ItemState(DONE if i % 2 else DEAD, i, 1 + i % 3, T + i, None)
    return obj


WIDE_AND_SEALED = (473, "551a2b5f5630d6f36b9c43427f295548eef1c20fefb1ffc1253e5ab4f626089e")

SEGMENT = Segment(SEG, "orders", T, T + 10_000, [
    SegmentItem(b"hello"),
    SegmentItem(b"\x00\xff", T + 5_000, {"k": "v", "n": [1, 2]}),
    SegmentItem(b"moved", None, None, T - 1_000_000_000),
])
SEGMENT_BYTES = bytes.fromhex(
    "87a166a77365676d656e74a17601a26964b73031386235653363326130302d30313233343536373839a57175"
    "657565a66f7264657273a763726561746564cf0000018bcfe56800aa7075626c6973685f6279cf0000018bcf"
    "e58f10a56974656d739393c40568656c6c6fc0c093c40200ffcf0000018bcfe57b8882a16ba176a16e920102"
    "94c4056d6f766564c0c0cf0000018b944a9e00"
)

MANIFEST = Manifest(
    "orders", T,
    QueueConfig(lease_timeout=2.5, max_attempts=3, dead_queue="dlq", attributes={"a": "b"}),
    [SegmentMeta(SEG, 3, T, 120), SegmentMeta("018b5e3c2a01-0123456789", 2, T + 1_000, 99,
                                              T - 100_000_000_000, 0)],
    {"k1": [SEG + ".0", T + 300_000]}, 5, T - 1_000_000, 9, "nonce9", "rqp",
    {"018b5e3c2a02-0123456789": T + 2_000}, T + 2_500,
)
MANIFEST_BYTES = bytes.fromhex(
    "8da166a86d616e6966657374a17601a57175657565a66f7264657273a763726561746564cf0000018bcfe568"
    "00a6636f6e66696786ad6c656173655f74696d656f7574cb4004000000000000a9726574656e74696f6ece00"
    "054600ac6d61785f617474656d70747303aa646561645f7175657565a3646c71b5726574656e74696f6e5f64"
    "6561645f6c6574746572c2aa6174747269627574657381a161a162a87365676d656e74739294b73031386235"
    "653363326130302d3031323334353637383903cf0000018bcfe568007896b73031386235653363326130312d"
    "3031323334353637383902cf0000018bcfe56be863cf00000174876e800000a46964656d81a26b3192b93031"
    "386235653363326130302d303132333435363738392e30cf0000018bcfe9fbe0a870726f647563656405a867"
    "635f666c6f6f72cf0000018bcfd625c0a376657209a56e6f6e6365a66e6f6e636539a5707572676592a37271"
    "7081b73031386235653363326130322d30313233343536373839cf0000018bcfe56fd0a97075726765645f61"
    "74cf0000018bcfe571c4"
)


def test_a_lease_object_of_every_state_is_written_as_before() -> None:
    obj = one_of_each_state()
    assert encode_lease(obj) == ONE_OF_EACH_STATE
    assert encode_lease(obj) == ONE_OF_EACH_STATE  # again, from each state's cached bytes
    assert decode_lease(ONE_OF_EACH_STATE) == one_of_each_state()


def test_a_wide_sealed_lease_object_is_written_as_before() -> None:
    data = encode_lease(wide_and_sealed())
    assert (len(data), hashlib.sha256(data).hexdigest()) == WIDE_AND_SEALED
    assert decode_lease(data) == wide_and_sealed()


def test_a_segment_is_written_as_before() -> None:
    assert encode_segment(SEGMENT) == SEGMENT_BYTES
    assert decode_segment(SEGMENT_BYTES) == SEGMENT


def test_a_manifest_is_written_as_before() -> None:
    assert encode_manifest(MANIFEST) == MANIFEST_BYTES
    assert decode_manifest(MANIFEST_BYTES) == MANIFEST


_TEXT = st.text(max_size=300)  # past 31 and 255 bytes: each length header's size
_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # every msgpack int width


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.dictionaries(st.integers(min_value=0, max_value=70_000), st.tuples(
    st.sampled_from([LEASED, WAITING, DONE, OUTPUTS_PENDING, DEAD_PENDING, DEAD]),
    _INT, _INT, _INT, st.none() | _TEXT,
    st.none() | st.tuples(_TEXT, _TEXT, _INT, _INT, _INT).map(list),
    st.none() | _TEXT, st.none() | _INT), max_size=20))
def test_any_lease_object_is_written_as_msgpack_writes_its_fields(
        fields: dict[int, tuple[Any, ...]]) -> None:
    """The codec writes a state's list with msgspec and joins cached bytes: the
    result is what msgpack's own packer makes of the object's fields."""
    # made here, not by the strategy: ItemState is the implementation under test
    states = {index: ItemState(*values) for index, values in fields.items()}
    obj = LeaseObject(SEG, states, ver=3, nonce="n", sealed=False)
    assert encode_lease(obj) == packed_by_msgpack(obj)


def packed_by_msgpack(obj: LeaseObject) -> bytes:
    """A lease object as msgpack's own packer writes its fields."""
    return msgpack.packb({  # type: ignore[no-any-return]
        "f": "lease", "v": FORMAT_VERSION, "segment": obj.segment,
        "items": {index: state.pack() for index, state in obj.items.items()},
        "ver": obj.ver, "nonce": obj.nonce, "sealed": obj.sealed}, use_bin_type=True)


def test_a_lease_objects_alike_states_are_written_as_msgpack_writes_them() -> None:
    """A request's new states are mostly alike and share one encoding: runs of alike
    states, broken by others (another v, deadline, error, request, first time or
    outputs), are written as msgpack writes each, then again from the cache."""
    t = 1_764_669_600_000
    kinds = [ItemState(LEASED, 1, 1, t, rq="r1", first=t - 5),
             ItemState(LEASED, 2, 2, t, rq="r1", first=t - 5),
             ItemState(LEASED, 1, 1, t + 1, rq="r1", first=t - 5),
             ItemState(DONE, 1, 1, t), ItemState(DONE, 1, 1, t, "boom"),
             ItemState(OUTPUTS_PENDING, 1, 1, t, None, ["q", SEG, 1, t, 9]),
             ItemState(OUTPUTS_PENDING, 1, 1, t, None, ["q", SEG, 2, t, 9]),
             ItemState(WAITING, 1, 1, t, rq="r2"), ItemState(WAITING, 1, 1, t, rq="r2", first=t)]
    states: dict[int, ItemState] = {}
    for n in range(300):
        kind = kinds[(n // 7) % len(kinds)] if n % 5 else kinds[n % len(kinds)]
        states[n] = ItemState(kind.s, kind.v, kind.attempts, kind.t, kind.err, kind.out,
                              kind.rq, kind.first)  # each item a state of its own
    obj = LeaseObject(SEG, states, ver=4, nonce="n", sealed=False)
    reference = packed_by_msgpack(obj)
    assert encode_lease(obj) == reference
    assert encode_lease(obj) == reference  # from the cached bytes
