"""Every change to a manifest, as data.

Each operation is a frozen dataclass: its name and arguments say what to do,
and ``apply(manifest, now)`` does it, a pure function that mutates the copy it
is given (the cell hands it a freshly decoded one) and returns its result, an
:class:`~okq.changes.Unchanged` when there is nothing to do, or raises an OkqError
before it mutates anything. ``to_wire`` / ``from_wire`` turn an operation into
``(name, arguments)`` of msgpack-able values and back, so a node can send its
changes to another (the sequencer) as data.

Each operation is safe to apply again after an ambiguous write that another
writer overwrote (docs/DESIGN.md, "Ambiguous writes"): it recognises its own
effect, or re-applying it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pydantic import ValidationError

from okq.changes import Unchanged
from okq.errors import (
    InvalidRequest,
    OkqError,
    OutcomeUnknown,
    Overloaded,
    PublishAborted,
    PurgeInProgress,
)
from okq.model import Manifest, QueueConfig, SegmentMeta


class KeysTaken(OkqError):
    """Idempotency keys of a publish were recorded by another publish since the
    segment was cut: the producer cuts it again without them."""


# -- the idempotency map ------------------------------------------------------------


def live_key(m: Manifest, key: str, now_ms: int) -> bool:
    entry = m.idem.get(key)
    return entry is not None and entry[1] > now_ms


def prune_idem(m: Manifest, now_ms: int) -> None:
    """Drop expired keys from the front of the map (keys are appended in roughly
    expiry order), so a publish costs O(expired), not O(map). A key left behind
    an unexpired one is dropped later; expired keys never count as live."""
    expired = []
    for k, v in m.idem.items():
        if v[1] > now_ms:
            break
        expired.append(k)
    for k in expired:
        del m.idem[k]


def _published(m: Manifest, segment_id: str) -> bool:
    """Listed, or listed once and dropped by a purge since."""
    return segment_id in m.purged or m.listed(segment_id)


# -- operations -----------------------------------------------------------------------


@dataclass(frozen=True)
class Publish:
    """Append a produced segment and record its idempotency keys."""

    name: ClassVar[str] = "publish"
    segment: SegmentMeta
    publish_by_ms: int
    keys: dict[str, str] = field(default_factory=dict)  # idempotency key -> item id
    keep_ms: int = 0  # how long keys are kept (window plus twice the skew bound)
    max_keys: int = 10_000  # live keys the map may hold

    def apply(self, m: Manifest, now: int, *, may_have_landed: bool = False) -> Unchanged | None:
        """``may_have_landed``: an earlier write carrying this publish failed
        ambiguously, so past the deadline its outcome is unknown, not "aborted"."""
        if _published(m, self.segment.id):
            return Unchanged()  # an earlier, ambiguous write of it landed: published once
        if now > self.publish_by_ms:
            if may_have_landed:
                raise OutcomeUnknown(
                    "the store failed while publishing and the publish deadline passed "
                    "before okq could confirm it: the items may or may not be in the queue "
                    "(produce with idempotency keys to retry safely)"
                )
            raise PublishAborted("the produce missed its publish deadline; retry it")
        if self.segment.created_ms < m.gc_floor_ms:
            raise PublishAborted("the segment fell behind the GC floor; retry the produce")
        if any(live_key(m, k, now) for k in self.keys):
            raise KeysTaken("idempotency keys were published meanwhile")
        prune_idem(m, now)
        if self.keys and len(m.idem) + len(self.keys) > self.max_keys:
            raise Overloaded(
                f"queue {m.queue!r} holds {len(m.idem)} idempotency keys, its limit is "
                f"{self.max_keys}; keyed produces wait until older keys expire",
                retry_after=5.0,
            )
        for k, iid in self.keys.items():
            m.idem[k] = [iid, now + self.keep_ms]
        _append(m, self.segment)
        return None


@dataclass(frozen=True)
class PublishWritten:
    """Publish a segment written earlier whose publication is already decided (a
    completion's outputs, a redrive), marking it ``seg:{id}`` in the map."""

    name: ClassVar[str] = "publish_written"
    segment: SegmentMeta
    keep_ms: int

    def apply(self, m: Manifest, now: int) -> Unchanged | None:
        marker = f"seg:{self.segment.id}"
        if live_key(m, marker, now) or _published(m, self.segment.id):
            return Unchanged()
        if self.segment.created_ms < m.gc_floor_ms:
            raise PublishAborted(f"outputs segment {self.segment.id} fell behind the GC floor")
        prune_idem(m, now)
        m.idem[marker] = [self.segment.id, now + self.keep_ms]
        _append(m, self.segment)
        return None


def _append(m: Manifest, segment: SegmentMeta) -> None:
    """List a published segment, numbered from the items ever published: its items
    are the queue's next sequence numbers (docs/DESIGN.md, "Ordered delivery")."""
    m.segments.append(replace(segment, seq=m.produced))
    m.produced += segment.count


@dataclass(frozen=True)
class UpdateConfig:
    """Change settings; those not named keep their values."""

    name: ClassVar[str] = "update_config"
    changes: dict[str, Any]

    def apply(self, m: Manifest, now: int) -> Manifest:
        m.config = merged_config(m.config, self.changes)
        return m


@dataclass(frozen=True)
class Purge:
    """Drop every segment. Records its request id (a re-apply is a no-op, so items
    produced since survive), every segment it dropped, until the GC floor passes
    it (a publisher re-applying an ambiguous publish, or a late help publishing a
    completion's outputs, learns the segment was published, then purged) and its
    time (front ends that limit how often a queue is purged read it)."""

    name: ClassVar[str] = "purge"
    rq: str
    #: Refuse (PurgeInProgress) when the last purge landed less than this long ago:
    #: checked inside the CAS, so two purges racing through two nodes cannot both run.
    not_within_ms: int = 0

    def apply(self, m: Manifest, now: int) -> Unchanged | None:
        if m.purge_rq == self.rq:
            return Unchanged()
        if self.not_within_ms and m.purged_ms and now - m.purged_ms < self.not_within_ms:
            raise PurgeInProgress(f"queue {m.queue!r} was purged {now - m.purged_ms} ms ago; "
                                  f"the next purge may run {self.not_within_ms} ms after it",
                                  queue=m.queue)
        m.purged.update({sm.id: sm.created_ms for sm in m.segments})
        m.clear_segments()
        m.purge_rq, m.purged_ms = self.rq, now
        forget_purged(m)
        return None


def forget_purged(m: Manifest) -> None:
    """Forget the purged segments below the GC floor: no publish of one can land
    any more (every publish refuses a segment created before the floor)."""
    m.purged = {sid: c for sid, c in m.purged.items() if c >= m.gc_floor_ms}


@dataclass(frozen=True)
class CompactionCommit:
    """Fold finished segments, replace each sealed group by its merged segment,
    raise the GC floor. Returns the ids of the merged segments it published."""

    name: ClassVar[str] = "compaction_commit"
    finished: frozenset[str]
    merged: tuple[tuple[SegmentMeta, tuple[str, ...]], ...]  # (merged segment, its sources)
    floor_ms: int

    def apply(self, m: Manifest, now: int) -> set[str]:
        present = {sm.id for sm in m.segments}
        published: set[str] = set()
        drop = set(self.finished) & present
        for new, sources in self.merged:
            if not all(sid in present for sid in sources):
                continue  # another pass merged them first (or this one, re-applied)
            if new.created_ms < m.gc_floor_ms:
                continue  # too late: a collector may already treat it as an orphan
            drop.update(sources)
            published.add(new.id)
        m.drop_segments(drop, now)
        m.segments.extend(new for new, _ in self.merged if new.id in published)
        m.gc_floor_ms = max(m.gc_floor_ms, self.floor_ms)
        forget_purged(m)
        return published


Operation = Publish | PublishWritten | UpdateConfig | Purge | CompactionCommit


def merged_config(config: QueueConfig, changes: dict[str, Any]) -> QueueConfig:
    """``config`` with ``changes`` applied and validated (an InvalidRequest names the field).

    ``attributes`` are merged key by key, a None value removing its key: two front-end
    calls that change different attributes at once both land (this runs in the CAS).
    """
    if "fifo" in changes and bool(changes["fifo"]) != config.fifo:
        raise InvalidRequest("fifo is set when a queue is created and never changed",
                             field="fifo")
    if config.fifo:  # a group's partition is fixed: docs/DESIGN.md, "Ordered delivery"
        for name, now in (("partitions", config.partitions), ("read_only", config.read_only)):
            if name in changes and changes[name] != now:
                raise InvalidRequest(f"{name} of an ordered (fifo) queue is fixed when it is "
                                     "created: a group moved to another partition would "
                                     "lose its order", field=name)
    merged = {**config.model_dump(), **changes}
    if "attributes" in changes:
        attributes = dict(config.attributes)
        for key, value in (changes["attributes"] or {}).items():
            if value is None:
                attributes.pop(key, None)
            else:
                attributes[key] = value
        merged["attributes"] = attributes
    try:
        return QueueConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"]) or "config"
        raise InvalidRequest(f"{name}: {first['msg']}", field=name) from None


# -- as data on the wire ----------------------------------------------------------------


def to_wire(op: Operation) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of msgpack-able values."""
    if isinstance(op, Publish):
        return op.name, {"segment": op.segment.pack(), "publish_by": op.publish_by_ms,
                         "keys": op.keys, "keep": op.keep_ms, "max_keys": op.max_keys}
    if isinstance(op, PublishWritten):
        return op.name, {"segment": op.segment.pack(), "keep": op.keep_ms}
    if isinstance(op, UpdateConfig):
        return op.name, {"changes": op.changes}
    if isinstance(op, Purge):
        return op.name, {"rq": op.rq}
    return op.name, {"finished": sorted(op.finished),
                     "merged": [[new.pack(), list(src)] for new, src in op.merged],
                     "floor": op.floor_ms}


def from_wire(name: str, args: dict[str, Any]) -> Operation:
    """The operation ``to_wire`` described; InvalidRequest for anything else."""
    try:
        if name == Publish.name:
            return Publish(SegmentMeta.unpack(args["segment"]), args["publish_by"],
                           dict(args["keys"]), args["keep"], args["max_keys"])
        if name == PublishWritten.name:
            return PublishWritten(SegmentMeta.unpack(args["segment"]), args["keep"])
        if name == UpdateConfig.name:
            return UpdateConfig(dict(args["changes"]))
        if name == Purge.name:
            return Purge(args["rq"])
        if name == CompactionCommit.name:
            merged = tuple((SegmentMeta.unpack(new), tuple(src)) for new, src in args["merged"])
            return CompactionCommit(frozenset(args["finished"]), merged, args["floor"])
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise InvalidRequest(f"malformed {name} operation: {exc}", field="operation") from exc
    raise InvalidRequest(f"unknown manifest operation {name!r}", field="operation")
