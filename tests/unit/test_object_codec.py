"""``pack_object``, through which every stored object but lease objects is written
(segments, manifests, chunks, markers): msgspec writes it, and its bytes must be
msgpack's, which older nodes wrote and which ETags hash (tests/unit/test_stored_bytes.py
pins whole objects; this holds the encoder equal on any field values)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from okq.errors import FormatError
from okq.model import pack_object, unpack_object

_TEXT = st.text(max_size=300)  # past 31 and 255 bytes: each length header's size
_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # every msgpack int width


class _Text(str):
    """A str subclass (an enum's or a model's) that a field may hold."""


class _Count(int):
    pass


_LEAF = (st.none() | st.booleans() | _INT | st.floats(allow_nan=False) | _TEXT
         | st.binary(max_size=300) | st.integers(0, 70_000).map(bytes)  # bin 8, 16, 32
         | _TEXT.map(_Text) | st.integers(0, 10).map(_Count)
         | st.builds(msgpack.Timestamp, st.integers(0, 2**34), st.integers(0, 999_999_999)))
# Array and map headers change size past 15 entries (and 65,535: the ``many`` case).
_VALUE = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=18) | st.tuples(inner, inner)
                      | st.dictionaries(st.text(max_size=40) | _INT, inner, max_size=18),
                      max_leaves=24)


@settings(max_examples=150, deadline=None)
@given(body=st.dictionaries(_TEXT, _VALUE, max_size=8))
def test_any_object_is_written_as_msgpack_packs_it(body: dict[str, Any]) -> None:
    """Segments, manifests and every other stored object go through ``pack_object``,
    which writes with msgspec: its bytes are msgpack's for any field values (every
    int width, string, binary, array and map header size, str and int subclasses,
    the timestamps a decoded object may hold)."""
    reference = msgpack.packb({"f": "thing", "v": 7, **body}, use_bin_type=True)
    assert pack_object("thing", body, 7) == reference


def test_many_entries_are_written_as_msgpack_packs_them() -> None:
    many = {"list": list(range(70_000)), "map": {n: None for n in range(70_000)}}
    assert pack_object("thing", many) == msgpack.packb({"f": "thing", "v": 1, **many},
                                                       use_bin_type=True)


def test_an_object_holding_another_extension_is_not_okqs() -> None:
    """msgspec would write an ``ExtType`` (a tuple) back as an array: decoding refuses it."""
    data = msgpack.packb({"f": "thing", "v": 1, "x": msgpack.ExtType(5, b"ab")})
    with pytest.raises(FormatError) as caught:
        unpack_object("thing", data)
    assert caught.value.data == data
    stamped = msgpack.packb({"f": "thing", "v": 1, "x": msgpack.Timestamp(1, 2)})
    assert pack_object("thing", {"x": unpack_object("thing", stamped)["x"]}) == stamped
