"""Manifest operations as pure functions of (manifest, now), and as data."""

from __future__ import annotations

import copy

import msgpack
import pytest

from okq.changes import Unchanged
from okq.errors import InvalidRequest, OutcomeUnknown, Overloaded, PublishAborted
from okq.manifest_ops import (
    CompactionCommit,
    KeysTaken,
    Operation,
    Publish,
    PublishWritten,
    Purge,
    UpdateConfig,
    from_wire,
    prune_idem,
    to_wire,
)
from okq.model import Manifest, QueueConfig, SegmentMeta

NOW = 1_700_000_000_000


def manifest(*segments: SegmentMeta) -> Manifest:
    return Manifest("q", NOW - 10_000, QueueConfig(), list(segments))


def seg(name: str, created: int = NOW, count: int = 2) -> SegmentMeta:
    return SegmentMeta(name, count, created, 100)


# -- publish ----------------------------------------------------------------------------


def test_publish_appends_counts_and_records_keys() -> None:
    m = manifest()
    op = Publish(seg("s1"), NOW + 60_000, {"k": "s1.0"}, keep_ms=540_000)
    assert op.apply(m, NOW) is None
    assert [s.id for s in m.segments] == ["s1"] and m.produced == 2
    assert m.idem == {"k": ["s1.0", NOW + 540_000]}


def test_publish_applied_again_is_a_no_op() -> None:
    m = manifest()
    op = Publish(seg("s1"), NOW + 60_000, {"k": "s1.0"}, keep_ms=540_000)
    op.apply(m, NOW)
    m.segments.append(seg("other"))  # another writer wrote on top
    before = copy.deepcopy(m)
    assert isinstance(op.apply(m, NOW + 5), Unchanged)
    assert m == before


def test_publish_of_a_purged_segment_is_a_no_op() -> None:
    m = manifest()
    m.purged = {"s1": NOW}
    assert isinstance(Publish(seg("s1"), NOW + 60_000).apply(m, NOW), Unchanged)
    assert m.segments == []


def test_publish_refusals() -> None:
    op = Publish(seg("s1"), NOW + 60_000, {"k": "s1.0"}, keep_ms=1000, max_keys=2)
    with pytest.raises(PublishAborted, match="deadline"):
        op.apply(manifest(), NOW + 60_001)
    with pytest.raises(OutcomeUnknown):
        op.apply(manifest(), NOW + 60_001, may_have_landed=True)
    floored = manifest()
    floored.gc_floor_ms = NOW + 1
    with pytest.raises(PublishAborted, match="GC floor"):
        op.apply(floored, NOW)
    taken = manifest()
    taken.idem["k"] = ["x.0", NOW + 10]
    with pytest.raises(KeysTaken):
        op.apply(taken, NOW)
    full = manifest()
    full.idem = {"a": ["x.0", NOW + 10], "b": ["x.1", NOW + 10]}
    with pytest.raises(Overloaded, match="idempotency keys"):
        op.apply(full, NOW)
    assert full.segments == []


def test_publish_prunes_expired_keys_and_keeps_live_ones() -> None:
    m = manifest()
    m.idem = {"old": ["x.0", NOW - 1], "live": ["x.1", NOW + 1]}
    Publish(seg("s1"), NOW + 60_000, {"new": "s1.0"}, keep_ms=5).apply(m, NOW)
    assert m.idem == {"live": ["x.1", NOW + 1], "new": ["s1.0", NOW + 5]}


def test_prune_stops_at_the_first_live_key() -> None:
    m = manifest()
    m.idem = {"a": ["x", NOW - 5], "b": ["y", NOW + 5], "c": ["z", NOW - 5]}
    prune_idem(m, NOW)
    assert list(m.idem) == ["b", "c"]  # "c" goes later; it is never counted as live


# -- publish written -----------------------------------------------------------------------


def test_publish_written_marks_and_is_idempotent() -> None:
    m = manifest()
    op = PublishWritten(seg("out"), keep_ms=1000)
    assert op.apply(m, NOW) is None
    assert m.idem["seg:out"] == ["out", NOW + 1000] and m.produced == 2
    m.segments = []  # compacted away meanwhile: the marker still says so
    assert isinstance(op.apply(m, NOW + 10), Unchanged)
    floored = manifest()
    floored.gc_floor_ms = NOW + 1
    with pytest.raises(PublishAborted):
        op.apply(floored, NOW)


# -- config and purge ----------------------------------------------------------------------


def test_update_config_merges_and_names_a_bad_field() -> None:
    m = manifest()
    assert UpdateConfig({"lease_timeout": 42}).apply(m, NOW) is m
    assert (m.config.lease_timeout, m.config.max_attempts) == (42, 0)
    with pytest.raises(InvalidRequest) as err:
        UpdateConfig({"max_attempts": -1}).apply(m, NOW)
    assert err.value.field == "max_attempts"
    assert m.config.max_attempts == 0


def test_attribute_changes_merge_key_by_key_and_none_removes() -> None:
    """Two changes of different attributes both land, whichever applies first."""
    m = manifest()
    UpdateConfig({"attributes": {"DelaySeconds": "5", "tag:a": "1"}}).apply(m, NOW)
    UpdateConfig({"attributes": {"tag:b": "2"}}).apply(m, NOW)
    assert m.config.attributes == {"DelaySeconds": "5", "tag:a": "1", "tag:b": "2"}
    UpdateConfig({"attributes": {"tag:a": None, "missing": None}}).apply(m, NOW)
    assert m.config.attributes == {"DelaySeconds": "5", "tag:b": "2"}
    with pytest.raises(InvalidRequest):
        UpdateConfig({"attributes": {"x": 3}}).apply(m, NOW)
    assert m.config.attributes == {"DelaySeconds": "5", "tag:b": "2"}


def test_purge_drops_segments_once_and_remembers_them_until_the_floor() -> None:
    m = manifest(seg("old", NOW - 600_000), seg("young", NOW - 1000))
    op = Purge("rq1")
    assert op.apply(m, NOW) is None
    assert m.segments == [] and m.purge_rq == "rq1"
    assert m.purged == {"old": NOW - 600_000, "young": NOW - 1000}  # old ones too
    m.segments.append(seg("after"))  # produced after the purge
    assert isinstance(op.apply(m, NOW + 5), Unchanged)
    assert [s.id for s in m.segments] == ["after"]
    m.gc_floor_ms = NOW - 500_000  # a compactor raised the floor past "old"
    Purge("rq2").apply(m, NOW + 400_000)
    assert m.purged == {"young": NOW - 1000, "after": NOW}


def test_a_purged_segment_is_not_published_again_however_late() -> None:
    """A late help of a completion's outputs, its marker long expired: the purge
    remembers the segment for as long as the floor lets it be published."""
    out = SegmentMeta("o", 1, NOW, 10)
    m = manifest()
    assert PublishWritten(out, keep_ms=540_000).apply(m, NOW) is None
    Purge("rq").apply(m, NOW + 400_000)
    assert isinstance(PublishWritten(out, keep_ms=540_000).apply(m, NOW + 10_000_000),
                      Unchanged)
    assert m.segments == []
    CompactionCommit(frozenset(), (), floor_ms=NOW + 1).apply(m, NOW + 10_000_000)
    assert m.purged == {}  # forgotten once the floor passed it, and refused instead
    with pytest.raises(PublishAborted, match="GC floor"):
        PublishWritten(out, keep_ms=540_000).apply(m, NOW + 10_000_000)


# -- compaction commit -----------------------------------------------------------------------


def test_compaction_commit_folds_merges_and_raises_the_floor() -> None:
    m = manifest(seg("a"), seg("b"), seg("c"), seg("d"))
    merged = seg("m", NOW + 5)
    op = CompactionCommit(frozenset({"a"}), ((merged, ("b", "c")),), floor_ms=NOW - 100)
    assert op.apply(m, NOW + 10) == {"m"}
    assert [s.id for s in m.segments] == ["d", "m"] and m.gc_floor_ms == NOW - 100
    before = copy.deepcopy(m)
    assert op.apply(m, NOW + 20) == set()  # applied again: its sources are gone
    assert m == before


def test_compaction_commit_skips_groups_it_may_not_publish() -> None:
    m = manifest(seg("b"), seg("c"))
    m.gc_floor_ms = NOW
    late = seg("late", NOW - 1)  # created before the floor: may already be an orphan
    partial = seg("partial", NOW + 1)
    op = CompactionCommit(frozenset(), ((late, ("b",)), (partial, ("c", "gone"))),
                          floor_ms=NOW - 10)
    assert op.apply(m, NOW + 2) == set()
    assert [s.id for s in m.segments] == ["b", "c"] and m.gc_floor_ms == NOW  # never lowered


# -- as data ---------------------------------------------------------------------------------

OPS: list[Operation] = [
    Publish(seg("s1"), NOW + 60_000, {"k": "s1.0"}, 540_000, 10),
    PublishWritten(SegmentMeta("o", 1, NOW, 10, NOW - 5), 1000),
    UpdateConfig({"lease_timeout": 5, "dead_queue": None}),
    Purge("rq"),
    CompactionCommit(frozenset({"a", "b"}), ((seg("m"), ("c", "d")),), NOW - 1),
]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_operations_round_trip_as_msgpack(op: Operation) -> None:
    name, args = to_wire(op)
    raw = msgpack.unpackb(msgpack.packb(args, use_bin_type=True), raw=False)
    assert from_wire(name, raw) == op


def test_unknown_or_malformed_operations_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="unknown"):
        from_wire("drop_everything", {})
    with pytest.raises(InvalidRequest, match="malformed"):
        from_wire("publish", {"segment": "nope"})
