"""A client-side history of a queue run and a checker for it, in the spirit of
Jepsen's queue checks: the clients write down what they were told, and the
checker says what the queue did wrong, knowing nothing of how okq works.

Producers record each produce's outcome by idempotency key: acknowledged
(with the ids returned), failed for sure, or unknown (a timeout, a 502, a
dropped connection: the items may or may not exist). A producer retries an
unknown outcome with the same keys, so a key is one item however many times
it was sent. Consumers record each delivery (item id, token, attempt, the key
in the payload, when the lease call began) and each completion's outcome for
that token: accepted, refused (the lease was lost) or unknown.

An item is known by its idempotency key where it has one (the producers put it
in the payload too, so each delivery names it): a compactor merge gives the items
it carries new ids (never while one is leased; docs/DESIGN.md "Known limits"), so
an item acknowledged as one id may be delivered and completed as another. Loss,
uncertainty, late deliveries and the items delivered are counted by key.

``check()`` reports:

* lost: acknowledged items with no completion accepted under any of their ids
  (an item whose completions all had unknown outcomes is *uncertain*, not lost:
  the last one may have landed);
* completed twice: items whose completion was accepted for two different
  deliveries (the same token accepted twice is one retried completion);
* late deliveries: a lease that began after a completion of the item had been
  accepted and still got the item (under any id: a completed item is never
  carried into a merge);
* unexpected: delivered items that no producer sent (neither an acknowledged
  id nor a key any produce carried);
* duplicated keys: one idempotency key that became two items: acknowledged as
  two ids, or completed (accepted) as two ids -- a merged item's old id is never
  completed, as it is merged only once no lease of it runs and it is not done;
* early redeliveries (when ``check`` is given the lease timeout, for histories
  without renewals): an item leased again while an earlier lease of it still
  ran, by the lease deadlines the node returned;
* the duplicate-delivery rate: deliveries beyond the first per item.

``check_order()`` checks an ordered (fifo) queue's promise (docs/DESIGN.md "Ordered
delivery", docs/API.md ``group``): the items of a message group are handed out in
the order their produces were acknowledged (and in order within one produce), one
handout of a group at a time, a handout being the items of the group in one lease
call's reply. For it the clients record more: each key's group, when a produce of
it was first *sent* (``sending``, before the call) and when one was acknowledged
(after the call returned); each lease call's id, when it began and returned (on
the history's clock and on the wall clock, the lease deadline's) and each item's
place in its reply; when each completion was first sent. Every time is taken
outside the call it bounds, so that a recorded "before" is before and a recorded
"after" is after whatever the server did. What follows is what those facts prove;
nothing is reported that a legitimate run could produce.

*Order between two items.* Y precedes X (Y < X) when both are of one group, Y's
produce was acknowledged, and that acknowledgement returned before X's first
produce was sent, or Y is earlier than X in one produce call (every resend of a
batch carries the same keys in the same order). Y's first landing is before its
acknowledgement and X's is after its first send (the keyed retries resend the same
keys: the queue answers with the first landing's ids), so Y was published first and
the queue must hand it out first. Keys of produces never acknowledged order
nothing (they may have landed, or not, at any time); neither do items without a
group.

*Out of order* (rule 1). Y is *unfinished at least until* ``U(Y)``: without dead
letters (the queue has no ``max_attempts``, as the campaign's queues) an item
finishes only by a completion landing, so ``U(Y)`` is the earliest *send* of any
completion of Y whose outcome was accepted or unknown (or never recorded); +inf when
there is none. A refused completion wrote nothing: the node refuses only what it
did not apply, and a repeat of a completion that landed is answered as the first
was (accepted), so a refusal after an attempt of unknown outcome means that attempt
did not land either -- except when the item's segment was compacted away in
between, which the load records as unknown (tests/campaign.py ``_refused``). With
dead letters possible (``dead_letters=True``) the client cannot see when a head is
dead-lettered, so ``U(Y)`` is instead the latest *beginning* of a lease call that
got Y: the queue hands out only unfinished items (the late-delivery check) and a
finished item stays finished, so Y was unfinished until then. A delivery of X in a
lease call that *returned* before ``U(Y)``, for some Y < X not in the same reply, is
a violation: X was handed out (before the call returned) while Y, earlier in its
group, was unfinished and not in X's handout -- but a handout starts at the
group's first unfinished item and takes items in a row, so it would hold Y.
An expired or refused lease of Y changes nothing here (Y stays first in its group
until it finishes), nor does an ambiguous produce of X (its first send bounds every
landing of it).

*Out of order within a handout* (rule 2). Y < X both in one lease call's reply,
X listed before Y's first place in it: a lease hands out a group's items in a
row, in order, starting at the group's first unfinished item. A reply may hold
more than one handout of a group (a lease call's passes can outlast a lease, and
hand the expired head out again, with the items after it, later in the same
reply); but Y listed later was unfinished then, so unfinished when X was handed
out, and X's handout would have listed Y before it.

*Two handouts in flight* (rule 3, ``in_flight=True``; skip it when the nodes'
clocks are not the client's, e.g. under libfaketime). A delivery d1 of Y is in
flight from its handout (before its call returned, ``r1``) until the first of:
its lease deadline as the node returned it (less ``tolerance``, mapped onto the
history's clock through the wall clock reading taken when the call returned), and
the first send of a completion of its token (any outcome), or of an accepted or
unknown completion of Y under any token. A delivery d2 of another item X of the
group in a *different* lease call that *began* after ``r1`` and *returned* before
d1's lease was over by that bound was handed out while d1 was in flight: two
handouts of one group at once. Which item is earlier does not matter. The rule
assumes the clients neither renew (a renewal only makes a lease longer: still
sound) nor retry or release leases (that would end one early: the campaign's
clients never do).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ACCEPTED, REFUSED, UNKNOWN = "accepted", "refused", "unknown"


@dataclass(frozen=True)
class Delivery:
    item_id: str
    token: str
    attempts: int
    key: str | None
    invoked: float  # when the lease call that returned it began
    deadline: float | None = None  # the lease deadline the node returned (epoch seconds)
    returned: float | None = None  # when that lease call returned (the history's clock)
    returned_wall: float | None = None  # the same moment on the wall clock (epoch seconds)
    call: int | None = None  # the lease call that returned it (``History.new_call``)
    index: int = 0  # the item's place in that call's reply
    group: str | None = None  # the group it was delivered with (meta.group)


@dataclass(frozen=True)
class Completion:
    item_id: str
    token: str
    outcome: str  # ACCEPTED, REFUSED or UNKNOWN
    returned: float  # when the completion call returned
    sent: float | None = None  # when the first attempt of it was sent (before the call)


@dataclass
class Report:
    produced: int = 0
    lost: list[str] = field(default_factory=list)
    uncertain: list[str] = field(default_factory=list)
    completed_twice: list[str] = field(default_factory=list)
    late_deliveries: list[tuple[str, str]] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated_keys: list[str] = field(default_factory=list)
    early_redeliveries: list[tuple[str, str]] = field(default_factory=list)
    unconfirmed_produces: int = 0
    retried_unknown: int = 0
    deliveries: int = 0
    items_delivered: int = 0
    refused_completions: int = 0

    @property
    def duplicate_delivery_rate(self) -> float:
        """Deliveries beyond each item's first, per item delivered."""
        if not self.items_delivered:
            return 0.0
        return (self.deliveries - self.items_delivered) / self.items_delivered

    @property
    def ok(self) -> bool:
        return not (self.lost or self.completed_twice or self.late_deliveries
                    or self.unexpected or self.duplicated_keys or self.early_redeliveries)

    def summary(self) -> str:
        return (
            f"{self.produced} acknowledged, {len(self.lost)} lost, "
            f"{len(self.uncertain)} uncertain, {len(self.completed_twice)} completed twice, "
            f"{len(self.late_deliveries)} late deliveries, {len(self.unexpected)} unexpected, "
            f"{len(self.duplicated_keys)} duplicated keys, {len(self.early_redeliveries)} "
            f"early redeliveries; {self.deliveries} deliveries of "
            f"{self.items_delivered} items (duplicate rate {self.duplicate_delivery_rate:.3f}), "
            f"{self.refused_completions} completions refused, {self.retried_unknown} unknown "
            f"produces retried, {self.unconfirmed_produces} never confirmed"
        )


@dataclass
class OrderReport:
    """``History.check_order()``'s findings (see the module docstring for the rules)."""

    groups: dict[str, int] = field(default_factory=dict)  # group -> items delivered
    #: deliveries that had at least one earlier item of their group to be checked against
    checked: int = 0
    #: rule 1: (X's key, X's token, Y's key): X handed out while Y < X was unfinished
    out_of_order: list[tuple[str, str, str]] = field(default_factory=list)
    #: rule 2: (lease call, X's key, Y's key): X before Y < X in one reply
    inverted: list[tuple[int, str, str]] = field(default_factory=list)
    #: rule 3: (X's key, X's token, Y's key, Y's token); None when not checked
    two_in_flight: list[tuple[str, str, str, str]] | None = None

    @property
    def violations(self) -> int:
        return len(self.out_of_order) + len(self.inverted) + len(self.two_in_flight or ())

    def summary(self) -> str:
        flight = "n/a" if self.two_in_flight is None else len(self.two_in_flight)
        return (f"order: {self.checked} deliveries checked in {len(self.groups)} groups; "
                f"{len(self.out_of_order)} out of order, {len(self.inverted)} inverted in a "
                f"handout, {flight} handed out while another handout was in flight")


class History:
    """What the clients saw. Safe to record into from several threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.wall = wall  # the clock of the nodes' lease deadlines (epoch seconds)
        self._lock = threading.Lock()
        self.acked: dict[str, set[str]] = defaultdict(set)  # key -> ids returned
        self.failed: set[str] = set()  # keys of produces that surely failed
        self.unknown: set[str] = set()  # keys sent at least once with no answer
        self.deliveries: list[Delivery] = []
        self.completions: list[Completion] = []
        # for the order check (``sending``): key -> group, first send, first
        # acknowledgement, (its batch's first key, its place in the batch)
        self.groups: dict[str, str] = {}
        self.first_sent: dict[str, float] = {}
        self.acked_at: dict[str, float] = {}
        self.batches: dict[str, tuple[str, int]] = {}
        self._calls = itertools.count()
        self.key_of: dict[str, str] = {}  # item id -> its key (acknowledged or delivered)

    # -- recording ----------------------------------------------------------------------

    def sending(self, keys: Sequence[str], groups: Sequence[str | None] | None = None) -> float:
        """A produce of ``keys`` (of these ``groups``) is about to be sent: each key's
        first send, group and place in its batch are recorded. The time, taken before
        the call goes out."""
        at = self.clock()
        with self._lock:
            for n, key in enumerate(keys):
                self.first_sent.setdefault(key, at)
                self.batches.setdefault(key, (keys[0], n))
                group = groups[n] if groups is not None else None
                if group is not None:
                    self.groups.setdefault(key, group)
        return at

    def produced(self, keys: Sequence[str], ids: Sequence[str]) -> None:
        """A produce of ``keys`` was acknowledged with ``ids`` (in the same order); call
        it after the call returned (the time it takes is the acknowledgement's)."""
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} ids")
        at = self.clock()
        with self._lock:
            for key, item_id in zip(keys, ids, strict=True):
                self.acked[key].add(item_id)
                self.acked_at.setdefault(key, at)
                self.key_of[item_id] = key

    def produce_failed(self, keys: Iterable[str], *, unknown: bool) -> None:
        """A produce of ``keys`` failed: surely (``unknown=False``, e.g. a 400) or
        with an unknown outcome (a timeout, a 5xx, a dropped connection)."""
        with self._lock:
            (self.unknown if unknown else self.failed).update(keys)

    def new_call(self) -> int:
        """An id for one lease call, to give each of its deliveries (``call``)."""
        with self._lock:
            return next(self._calls)

    def delivered(self, item_id: str, token: str, attempts: int, *, key: str | None = None,
                  invoked: float | None = None, deadline: float | None = None,
                  returned: float | None = None, returned_wall: float | None = None,
                  call: int | None = None, index: int = 0, group: str | None = None) -> None:
        """A lease call that began at ``invoked`` and returned at ``returned`` (by
        default: now, on the history's clock and on the wall clock) returned this
        delivery, leased until ``deadline`` (epoch seconds, as the node said), at place
        ``index`` of lease call ``call``'s reply."""
        now = self.clock()
        at = now if invoked is None else invoked
        done = now if returned is None else returned
        wall = self.wall() if returned_wall is None else returned_wall
        with self._lock:
            self.deliveries.append(Delivery(item_id, token, attempts, key, at, deadline, done,
                                            wall, call, index, group))
            if key is not None:
                self.key_of.setdefault(item_id, key)

    def completed(self, item_id: str, token: str, outcome: str, *,
                  sent: float | None = None) -> None:
        """A completion of one delivery, first sent at ``sent``, returned ``outcome``
        (ACCEPTED, REFUSED, UNKNOWN)."""
        if outcome not in (ACCEPTED, REFUSED, UNKNOWN):
            raise ValueError(f"unknown outcome {outcome!r}")
        with self._lock:
            self.completions.append(Completion(item_id, token, outcome, self.clock(), sent))

    # -- questions while running --------------------------------------------------------

    def acked_ids(self) -> set[str]:
        with self._lock:
            return {i for ids in self.acked.values() for i in ids}

    def settled_ids(self) -> set[str]:
        """Items with a completion accepted or of unknown outcome."""
        with self._lock:
            return {c.item_id for c in self.completions if c.outcome != REFUSED}

    def outstanding(self) -> set[str]:
        """Acknowledged items not settled yet (under any of their ids): what a drain
        still waits for."""
        with self._lock:
            settled = {self.key_of.get(c.item_id, c.item_id) for c in self.completions
                       if c.outcome != REFUSED}
            return {i for key, ids in self.acked.items() for i in ids
                    if key not in settled and i not in settled}

    def dump(self) -> dict[str, Any]:
        """Everything recorded, as JSON takes it (the campaign writes it down beside a
        failed scenario's logs)."""
        with self._lock:
            return {"acked": {k: sorted(v) for k, v in self.acked.items()},
                    "failed": sorted(self.failed), "unknown": sorted(self.unknown),
                    "groups": self.groups, "first_sent": self.first_sent,
                    "acked_at": self.acked_at, "batches": self.batches,
                    "deliveries": [asdict(d) for d in self.deliveries],
                    "completions": [asdict(c) for c in self.completions]}

    # -- the check ------------------------------------------------------------------------

    def check(self, lease_timeout: float | None = None, tolerance: float = 0.05) -> Report:
        """The report; with ``lease_timeout`` (every lease's, no renewals), also the
        leases that began more than ``tolerance`` seconds before the previous one ended."""
        with self._lock:
            report = _Checker(self).report()
            if lease_timeout is not None:
                report.early_redeliveries = _early(self.deliveries, lease_timeout, tolerance)
            return report

    def check_order(self, *, in_flight: bool = True, dead_letters: bool = False,
                    tolerance: float = 0.05) -> OrderReport:
        """An ordered queue's order and one-handout rules (the module docstring):
        ``in_flight`` when the nodes' lease deadlines are on the client's wall clock,
        ``dead_letters`` when the queue may dead-letter an item (``max_attempts``)."""
        with self._lock:
            return _Order(self, dead_letters).report(in_flight, tolerance)


class _Checker:
    """One pass over a (locked) history."""

    def __init__(self, h: History) -> None:
        self.h = h
        self.acked = {i for ids in h.acked.values() for i in ids}
        self.accepted: dict[str, set[str]] = defaultdict(set)  # id -> tokens accepted
        # by item (its key, else its id): completions accepted (when first), unknown
        self.first_accept: dict[str, float] = {}
        self.unsure: set[str] = set()
        self.accepted_ids: dict[str, set[str]] = defaultdict(set)  # key -> ids accepted
        for c in h.completions:
            item = self.item(c.item_id)
            if c.outcome == ACCEPTED:
                self.accepted[c.item_id].add(c.token)
                self.accepted_ids[item].add(c.item_id)
                self.first_accept[item] = min(c.returned, self.first_accept.get(item, c.returned))
            elif c.outcome == UNKNOWN:
                self.unsure.add(item)

    def item(self, item_id: str) -> str:
        """What an id stands for: its item's key, else the id."""
        return self.h.key_of.get(item_id, item_id)

    def settled(self, item_id: str) -> bool:
        """A completion of the id's item was accepted, or may have been."""
        item = self.item(item_id)
        return item in self.first_accept or item in self.unsure

    def report(self) -> Report:
        h = self.h
        delivered = {self.item(d.item_id) for d in h.deliveries}
        return Report(
            produced=len(self.acked),
            lost=sorted(i for i in self.acked if not self.settled(i)),
            uncertain=sorted(i for i in self.acked
                             if self.settled(i) and self.item(i) not in self.first_accept),
            completed_twice=sorted(i for i, tokens in self.accepted.items() if len(tokens) > 1),
            late_deliveries=self.late(),
            unexpected=self.unexpected(),
            duplicated_keys=self.duplicated_keys(),
            unconfirmed_produces=len(h.unknown - set(h.acked)),
            retried_unknown=len(h.unknown & set(h.acked)),
            deliveries=len(h.deliveries),
            items_delivered=len(delivered),
            refused_completions=sum(c.outcome == REFUSED for c in h.completions),
        )

    def late(self) -> list[tuple[str, str]]:
        return [(d.item_id, d.token) for d in self.h.deliveries
                if d.invoked > self.first_accept.get(self.item(d.item_id), math.inf)]

    def unexpected(self) -> list[str]:
        sent = set(self.h.acked) | self.h.unknown  # a produce that surely failed sent nothing
        return sorted({d.item_id for d in self.h.deliveries
                       if d.item_id not in self.acked and (d.key is None or d.key not in sent)})

    def duplicated_keys(self) -> list[str]:
        """Keys that became more than one item: acknowledged as two ids, or completed
        as two (a merge renames an item, but only one of its names is completed)."""
        twice = {k for k, ids in self.h.acked.items() if len(ids) > 1}
        twice |= {k for k, ids in self.accepted_ids.items() if len(ids) > 1}
        return sorted(twice)


def _early(deliveries: list[Delivery], lease_timeout: float,
           tolerance: float) -> list[tuple[str, str]]:
    """Deliveries whose lease began (deadline - timeout) before the item's previous
    lease had ended (its deadline)."""
    by_item: dict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        if d.deadline is not None:
            by_item[d.item_id].append(d)
    early: list[tuple[str, str]] = []
    for leases in by_item.values():
        leases.sort(key=lambda d: d.deadline or 0.0)
        for before, after in itertools.pairwise(leases):
            assert before.deadline is not None and after.deadline is not None
            if after.deadline - lease_timeout < before.deadline - tolerance:
                early.append((after.item_id, after.token))
    return early


class _Order:
    """One pass of the order rules over a (locked) history."""

    def __init__(self, h: History, dead_letters: bool) -> None:
        self.h = h
        self.by_group: dict[str, list[Delivery]] = defaultdict(list)
        self.calls: dict[int, list[Delivery]] = defaultdict(list)
        for d in h.deliveries:
            group = self.group(d)
            if group is not None and d.key is not None:
                self.by_group[group].append(d)
                if d.call is not None:
                    self.calls[d.call].append(d)
        self.invoked = {d.token: d.invoked for d in h.deliveries}
        self.token_key = {d.token: d.key for d in h.deliveries if d.key is not None}
        #: per key, the first send of a completion of it that was not refused
        self.completing = self._completing()
        #: per key, ``U``: the key's item was unfinished at every time before it
        self.finish = self._last_leased() if dead_letters else self.completing

    def group(self, d: Delivery) -> str | None:
        """The group the producer gave the delivery's key (else the one it came with)."""
        return (self.h.groups.get(d.key) if d.key is not None else None) or d.group

    def _sent(self, c: Completion) -> float:
        """When a completion was first sent; without a record, the beginning of the
        lease call that got its token (no completion is sent before that)."""
        if c.sent is not None:
            return c.sent
        return self.invoked.get(c.token, -math.inf)

    def _last_leased(self) -> dict[str, float]:
        """Per key, the latest beginning of a lease call that got it."""
        last: dict[str, float] = {}
        for d in self.h.deliveries:
            if d.key is not None:
                last[d.key] = max(d.invoked, last.get(d.key, -math.inf))
        return last

    def _completing(self) -> dict[str, float]:
        first: dict[str, float] = {}
        for c in self.h.completions:
            key = self.h.key_of.get(c.item_id) or self.token_key.get(c.token)
            if key is not None and c.outcome != REFUSED:
                first[key] = min(self._sent(c), first.get(key, math.inf))
        return first

    def before(self, y: str, x: str) -> bool:
        """Y < X: the queue must hand Y out before X (the module docstring)."""
        h = self.h
        group = h.groups.get(y)
        if y == x or y not in h.acked_at or group is None or group != h.groups.get(x):
            return False
        sent = h.first_sent.get(x)
        if sent is not None and h.acked_at[y] < sent:
            return True
        by, bx = h.batches.get(y), h.batches.get(x)
        return by is not None and bx is not None and by[0] == bx[0] and by[1] < bx[1]

    def report(self, in_flight: bool, tolerance: float) -> OrderReport:
        report = OrderReport(groups={g: len({d.key for d in ds})
                                     for g, ds in sorted(self.by_group.items())})
        for group, deliveries in self.by_group.items():
            self.out_of_order(group, deliveries, report)
        for call, items in sorted(self.calls.items()):
            report.inverted += self.inverted(call, items)
        if in_flight:
            report.two_in_flight = []
            for deliveries in self.by_group.values():
                report.two_in_flight += self.overlaps(deliveries, tolerance)
        return report

    def inverted(self, call: int, items: list[Delivery]) -> list[tuple[int, str, str]]:
        """Rule 2 for one reply: X listed before the first place of a Y < X in it."""
        first: dict[str, int] = {}
        for d in sorted(items, key=lambda d: d.index):
            assert d.key is not None
            first.setdefault(d.key, d.index)
        return [(call, x, y) for x, at in first.items() for y, later in first.items()
                if later > at and self.before(y, x)]

    def out_of_order(self, group: str, deliveries: list[Delivery],
                     report: OrderReport) -> None:
        """Rule 1 for one group: sweep the deliveries by their key's first send, with
        the acknowledged keys acknowledged before it in a heap by ``U``."""
        h = self.h
        acked = sorted((h.acked_at[k], k) for k in h.groups
                       if h.groups[k] == group and k in h.acked_at)
        batch_mates: dict[str, list[str]] = defaultdict(list)
        for k, (first, _) in h.batches.items():
            if h.groups.get(k) == group:
                batch_mates[first].append(k)
        heap: list[tuple[float, str]] = []
        n = 0
        for d in sorted((d for d in deliveries if d.key in h.first_sent),
                        key=lambda d: h.first_sent[d.key or ""]):
            x = d.key
            assert x is not None and d.returned is not None
            while n < len(acked) and acked[n][0] < h.first_sent[x]:
                heapq.heappush(heap, (-self.finish.get(acked[n][1], math.inf), acked[n][1]))
                n += 1
            mine = self.calls.get(d.call, []) if d.call is not None else []
            handout = {o.key for o in mine if o.key is not None} | {x}
            witnesses = [(-u, y) for u, y in _top(heap, handout)]
            mates = batch_mates.get(h.batches[x][0], ()) if x in h.batches else ()
            witnesses += [(self.finish.get(y, math.inf), y) for y in mates
                          if y not in handout and self.before(y, x)]
            if witnesses:
                report.checked += 1
                u, y = max(witnesses)
                if d.returned < u:
                    report.out_of_order.append((x, d.token, y))

    def overlaps(self, deliveries: list[Delivery],
                 tolerance: float) -> list[tuple[str, str, str, str]]:
        """Rule 3 for one group: sweep the deliveries by when their call began, with
        those whose call returned by then in a heap by when their lease was surely
        still running."""
        ends: dict[str, float] = {}  # token -> end of its provable time in flight
        for c in self.h.completions:
            ends[c.token] = min(self._sent(c), ends.get(c.token, math.inf))
        first = sorted((d for d in deliveries if d.deadline is not None
                        and d.returned is not None and d.returned_wall is not None),
                       key=lambda d: d.returned or 0.0)
        heap: list[tuple[float, str, int]] = []
        found: list[tuple[str, str, str, str]] = []
        n = 0
        for d2 in sorted(deliveries, key=lambda d: d.invoked):
            while n < len(first) and (first[n].returned or 0.0) <= d2.invoked:
                d1 = first[n]
                assert d1.deadline is not None and d1.returned is not None \
                    and d1.returned_wall is not None and d1.key is not None
                end = min(d1.returned + (d1.deadline - d1.returned_wall) - tolerance,
                          ends.get(d1.token, math.inf), self.completing.get(d1.key, math.inf))
                heapq.heappush(heap, (-end, d1.token, n))
                n += 1
            best = _top(heap, {d2.token}, skip=functools.partial(self._same, d2=d2, first=first))
            if best and d2.returned is not None and d2.returned < -best[0][0]:
                d1 = first[best[0][2]]
                found.append((d2.key or "", d2.token, d1.key or "", d1.token))
        return found

    @staticmethod
    def _same(entry: tuple[float, str, int], d2: Delivery, first: list[Delivery]) -> bool:
        d1 = first[entry[2]]
        return d1.key == d2.key or (d1.call is not None and d1.call == d2.call)


def _top(heap: list[Any], exclude: set[str],
         skip: Callable[[Any], bool] | None = None) -> list[Any]:
    """The heap's least entry whose second field is not in ``exclude`` (nor ``skip``s),
    as a list of one (or none); the heap is left as it was."""
    popped = []
    found = []
    while heap:
        entry = heapq.heappop(heap)
        popped.append(entry)
        if entry[1] not in exclude and not (skip and skip(entry)):
            found.append(entry)
            break
    for entry in popped:
        heapq.heappush(heap, entry)
    return found
