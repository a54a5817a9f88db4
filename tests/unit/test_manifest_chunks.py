"""A manifest's segment list in chunks (okq/model.py, okq/manifests.py): the head a
publish rewrites stays small whatever the backlog, the list it stands for is the
list the changes made, and an older okq reads a manifest that has no chunks."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from okq.errors import FormatError
from okq.model import (
    Chunk,
    Manifest,
    QueueConfig,
    SegmentMeta,
    decode_manifest,
    encode_manifest,
    new_nonce,
)
from tests.engines import property_examples


def seg(n: int) -> SegmentMeta:
    return SegmentMeta(f"{n:012x}-{n:010x}", 1000, n, 1_000_000, None, 0)


class Stored:
    """The chunks written so far, as a store would hold them."""

    def __init__(self) -> None:
        self.chunks: dict[str, Chunk] = {}

    def pack(self, m: Manifest, per_chunk: int, now: int = 1) -> list[Chunk]:
        new = m.pack_chunks(per_chunk, now, self.chunks.__contains__)
        self.chunks.update((c.id, c) for c in new)
        return new


def manifest(segments: list[SegmentMeta] | None = None) -> Manifest:
    return Manifest("q", 1, QueueConfig(), list(segments or []), ver=1, nonce="n")


def test_a_manifest_without_chunks_keeps_format_1() -> None:
    """What okq before chunks reads: no ``chunks`` field, ``v`` 1, every segment listed."""
    m = manifest([seg(n) for n in range(5)])
    raw = msgpack.unpackb(encode_manifest(m), strict_map_key=False)
    assert raw["v"] == 1 and "chunks" not in raw and len(raw["segments"]) == 5
    Stored().pack(m, 0)  # 0: cut no chunks
    assert m.chunks == [] and msgpack.unpackb(encode_manifest(m))["v"] == 1


def test_a_head_references_its_chunks_and_lists_the_tail() -> None:
    m = manifest([seg(n) for n in range(7)])
    stored = Stored()
    new = stored.pack(m, 3)
    assert [len(c.segments) for c in new] == [3, 3]
    raw = msgpack.unpackb(encode_manifest(m), strict_map_key=False)
    assert raw["v"] == 2
    assert raw["chunks"] == [[c.id, 3] for c in m.chunks]
    assert [s[0] for s in raw["segments"]] == [seg(6).id]
    back = decode_manifest(encode_manifest(m), stored.chunks)
    assert back == m and back.segments == [seg(n) for n in range(7)]
    assert stored.pack(m, 3) == []  # nothing more to write until the tail fills again


def test_a_head_whose_chunk_was_not_read_is_refused_by_name() -> None:
    m = manifest([seg(n) for n in range(4)])
    Stored().pack(m, 2)
    data = encode_manifest(m)
    with pytest.raises(FormatError, match=m.chunks[0].id):
        decode_manifest(data)


def test_chunks_that_are_not_the_front_of_the_list_are_never_written() -> None:
    m = manifest([seg(n) for n in range(4)])
    Stored().pack(m, 2)
    m.segments.pop(0)  # a change that bypassed drop_segments
    with pytest.raises(ValueError, match="not the front"):
        encode_manifest(m)


def test_a_chunk_of_the_wrong_size_is_a_format_error() -> None:
    m = manifest([seg(n) for n in range(4)])
    stored = Stored()
    stored.pack(m, 2)
    first = m.chunks[0]
    stored.chunks[first.id] = Chunk(first.id, first.segments[:1])
    with pytest.raises(FormatError, match="holds 1 segments, not 2"):
        decode_manifest(encode_manifest(m), stored.chunks)


def test_the_head_a_publish_writes_stays_small_at_any_backlog() -> None:
    """20,000 segments (about 20M items at 1,000 a segment) appended one publish at a
    time, 128 a chunk: the largest head written against the whole list's size."""
    m, stored = manifest(), Stored()
    largest = 0
    for n in range(20_000):
        m.segments.append(seg(n))
        stored.pack(m, 128)
        largest = max(largest, len(encode_manifest(m)))
    whole = len(encode_manifest(manifest(m.segments)))
    assert len(m.chunks) == 20_000 // 128
    # 127 segments of the tail at about 55 bytes, one reference (about 30 bytes) per chunk
    assert largest < 127 * 60 + len(m.chunks) * 32 + 300, largest
    assert whole > 50 * largest, (whole, largest)


def test_dropping_segments_rewrites_only_the_chunks_that_held_them() -> None:
    m, stored = manifest([seg(n) for n in range(10)]), Stored()
    stored.pack(m, 3)
    a, b, c = m.chunks
    m.drop_segments({seg(4).id, seg(9).id}, 5)
    assert m.chunks[0] is a and m.chunks[2] is c
    assert m.chunks[1] is not b and m.chunks[1].segments == [seg(3), seg(5)]
    assert [s.id for s in m.segments] == [seg(n).id for n in (0, 1, 2, 3, 5, 6, 7, 8)]
    new = stored.pack(m, 3)
    # the rewritten chunk (2 segments) is joined with a neighbour only if they fit in 3
    assert [len(x.segments) for x in m.chunks] == [3, 2, 3]
    assert new == [m.chunks[1]]
    assert decode_manifest(encode_manifest(m), stored.chunks) == m


def test_what_a_compaction_leaves_of_its_chunks_is_joined() -> None:
    m, stored = manifest([seg(n) for n in range(12)]), Stored()
    stored.pack(m, 4)
    m.drop_segments({seg(n).id for n in (0, 1, 2, 5, 6)}, 5)
    stored.pack(m, 4)
    assert [[s.created_ms for s in c.segments] for c in m.chunks] == [[3, 4, 7], [8, 9, 10, 11]]
    m.clear_segments()
    assert m.segments == [] and m.chunks == []
    assert msgpack.unpackb(encode_manifest(m))["v"] == 1


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 9)),
        st.tuples(st.just("drop"), st.lists(st.integers(0, 200), max_size=12)),
        st.tuples(st.just("pack"), st.integers(0, 6)),
        st.tuples(st.just("copy"), st.just(0)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=property_examples(60, 150), deadline=None)
@given(ops=OPS)
def test_chunks_always_stand_for_the_list_the_changes_made(ops: list[tuple[str, Any]]) -> None:
    """Whatever appends, drops, cuts, copies and purges: the head and its chunks decode
    to the list a plain list would hold, ``listed`` agrees with it, no chunk outgrows
    its size, and a written chunk never changes."""
    m, stored, model = manifest(), Stored(), []
    made = widest = 0
    for op, arg in ops:
        if op == "append":
            for _ in range(arg):
                model.append(seg(made))
                m.segments.append(seg(made))
                made += 1
        elif op == "drop":
            ids = {seg(n).id for n in arg}
            model = [s for s in model if s.id not in ids]
            m.drop_segments(ids, made)
        elif op == "pack":
            before = {cid: list(c.segments) for cid, c in stored.chunks.items()}
            new = stored.pack(m, arg)
            assert all(c.id not in before for c in new)
            assert all(stored.chunks[cid].segments == segs for cid, segs in before.items())
            widest = max(widest, arg or 128)  # nodes may cut chunks of different sizes
            assert all(len(c.segments) <= widest for c in m.chunks)
            if arg:
                assert len(m.segments) - m.n_chunked < arg
            assert decode_manifest(encode_manifest(m), stored.chunks) == m
        elif op == "copy":
            m = m.copy()
        else:
            m.clear_segments()
            model = []
        assert m.segments == model
        assert m.segments[:m.n_chunked] == [s for c in m.chunks for s in c.segments]
        for n in range(made):
            assert m.listed(seg(n).id) == (seg(n) in model)


@settings(max_examples=property_examples(40, 100), deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 80), max_size=4),
                                st.booleans()), max_size=25))
def test_the_lease_walks_order_is_the_sorted_list_after_any_change(
        steps: list[tuple[int, list[int], bool]]) -> None:
    """The scan order kept across manifest versions (new segments inserted into the
    last order when only appended) is always the list sorted by ready time, ties in
    list order, as sorting it whole would give."""
    from okq import scheduler

    m, made = manifest(), 0
    for appended, dropped, merged in steps:
        for _ in range(appended):
            sm = seg(made)
            if merged and made % 3 == 0:  # a merged segment carrying older items
                sm = SegmentMeta(sm.id, 1, made, 10, max(0, made - 7), 0)
            m = m.copy()
            m.segments.append(sm)
            made += 1
        if dropped:
            m = m.copy()
            m.drop_segments({seg(n).id for n in dropped}, made)
        m.ver, m.nonce = m.ver + 1, new_nonce()  # a new version, as a write makes
        order, _ = scheduler._scan_order(m)
        assert order == sorted(m.segments, key=lambda s: s.first_ready_ms)
