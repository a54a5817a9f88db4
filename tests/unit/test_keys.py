"""Object keys, names and ids (okq/keys.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from okq import keys
from okq.errors import InvalidRequest

SEG = "018b5e3c2a00-0123456789"


@pytest.mark.parametrize(
    "name", ["a", "Z", "0", "orders", "orders.dlq", "a_b-c.d", "9lives", "x" * 128, "A-"]
)
def test_check_name_accepts(name: str) -> None:
    assert keys.check_name(name, "queue") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 129,
        "-a",
        ".a",
        "_a",
        "a b",
        "a/b",
        "a\\b",
        "é",
        "a:b",
        "a*",
        " a",
        "a ",
        "a\tb",
        "..",
        "a\x00",
    ],
)
def test_check_name_refuses(name: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        keys.check_name(name, "queue")
    assert info.value.field == "queue"
    assert info.value.details["field"] == "queue"
    assert info.value.message.startswith("queue must be")
    assert repr(name) in info.value.message


@pytest.mark.parametrize("value", [None, 5, b"abc", ["a"]])
def test_check_name_refuses_non_strings(value: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        keys.check_name(value, "namespace")  # type: ignore[arg-type]
    assert info.value.field == "namespace"


@pytest.mark.parametrize("name", ["orders\n", "x" * 128 + "\n"])
def test_check_name_refuses_a_trailing_newline(name: str) -> None:
    with pytest.raises(InvalidRequest):
        keys.check_name(name, "queue")


@given(st.text(max_size=140))
def test_check_name_accepts_exactly_the_documented_names(name: str) -> None:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    ok = 1 <= len(name) <= 128 and set(name) <= allowed and name[0] not in "._-"
    if ok:
        assert keys.check_name(name, "f") == name
    else:
        with pytest.raises(InvalidRequest):
            keys.check_name(name, "f")


# -- segment ids -----------------------------------------------------------------------


def test_segment_id_format_and_parse_back() -> None:
    sid = keys.new_segment_id(1_700_000_000_123)
    assert keys.SEGMENT_RE.match(sid)
    assert sid.startswith(f"{1_700_000_000_123:012x}-")
    assert keys.segment_created_ms(sid) == 1_700_000_000_123


def test_segment_ids_are_unique() -> None:
    ids = {keys.new_segment_id(1_700_000_000_000) for _ in range(200)}
    assert len(ids) == 200


@given(st.lists(st.integers(0, 16**12 - 1), min_size=2, max_size=20, unique=True))
def test_segment_ids_sort_by_creation_time(times: list[int]) -> None:
    ids = [keys.new_segment_id(t) for t in times]
    assert [keys.segment_created_ms(i) for i in sorted(ids)] == sorted(times)
    for sid, t in zip(ids, times, strict=True):
        assert keys.segment_created_ms(sid) == t
        assert keys.parse_item_id(keys.item_id(sid, 0)) == (sid, 0)


# -- keys ---------------------------------------------------------------------------------


def test_object_keys() -> None:
    assert keys.manifests_prefix("ns") == "ns/manifests/"
    assert keys.manifest_key("ns", "q") == "ns/manifests/q"
    assert keys.manifest_key("ns", "q").startswith(keys.manifests_prefix("ns"))
    assert keys.segment_key("ns", "q", SEG) == f"ns/segments/q/{SEG}"
    assert keys.lease_key("ns", "q", SEG) == f"ns/leases/q/{SEG}"


def test_queue_names_cannot_collide_in_keys() -> None:
    # a queue named like a prefix of another never shares its manifest key
    assert keys.manifest_key("ns", "q") != keys.manifest_key("ns", "q.1")
    assert not keys.segment_key("ns", "q.1", SEG).startswith("ns/segments/q/")


# -- item ids -------------------------------------------------------------------------------


@given(st.integers(0, 2**63))
def test_item_id_round_trip(index: int) -> None:
    assert keys.parse_item_id(keys.item_id(SEG, index)) == (SEG, index)


@pytest.mark.parametrize("count", [0, 1, 1024, 1025, 5000])
def test_item_ids_are_each_items_id(count: int) -> None:
    # the suffix table grows past its first 1,024 when a segment is longer
    assert keys.item_ids(SEG, count) == [keys.item_id(SEG, n) for n in range(count)]
    assert keys.item_ids(SEG, 3) == [f"{SEG}.0", f"{SEG}.1", f"{SEG}.2"]


@pytest.mark.parametrize(
    "value",
    [
        "",
        ".",
        "5",
        SEG,
        f"{SEG}.",
        f"{SEG}.-1",
        f"{SEG}.+1",
        f"{SEG}.1.5",
        f"{SEG}.x",
        f"{SEG}. 1",
        f"{SEG}.1 ",
        f"{SEG.upper()}.1",
        f"{SEG}0.1",
        f"{SEG[1:]}.1",
        "018b5e3c2a00_0123456789.1",
        "018b5e3c2a000123456789.1",
        f"x{SEG}.1",
        f"{SEG}.1.",
    ],
)
def test_parse_item_id_refuses_junk(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        keys.parse_item_id(value, "ids[3]")
    assert info.value.field == "ids[3]"
    assert "ids[3] is not an okq item id" in info.value.message


def test_parse_item_id_default_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        keys.parse_item_id("junk")
    assert info.value.field == "id"


@pytest.mark.parametrize("index", ["\u00b2", "1\u00b3"])
def test_parse_item_id_refuses_non_ascii_digits_that_int_cannot_parse(index: str) -> None:
    with pytest.raises(InvalidRequest):
        keys.parse_item_id(f"{SEG}.{index}")


@pytest.mark.parametrize(
    "value", [f"{SEG}.\u0663", f"{SEG}.\uff11", f"{SEG}\n.5"], ids=["arabic", "fullwidth", "nl"]
)
def test_parse_item_id_refuses_non_canonical_ids(value: str) -> None:
    with pytest.raises(InvalidRequest):
        keys.parse_item_id(value)
