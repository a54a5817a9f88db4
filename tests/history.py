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

``check()`` reports:

* lost: acknowledged items with no completion accepted (an item whose
  completions all had unknown outcomes is *uncertain*, not lost: the last one
  may have landed);
* completed twice: items whose completion was accepted for two different
  deliveries (the same token accepted twice is one retried completion);
* late deliveries: a lease that began after a completion of the item had been
  accepted and still got the item;
* unexpected: delivered items that no producer sent (neither an acknowledged
  id nor a key any produce carried);
* duplicated keys: one idempotency key that became two items;
* early redeliveries (when ``check`` is given the lease timeout, for histories
  without renewals): an item leased again while an earlier lease of it still
  ran, by the lease deadlines the node returned;
* the duplicate-delivery rate: deliveries beyond the first per item.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

ACCEPTED, REFUSED, UNKNOWN = "accepted", "refused", "unknown"


@dataclass(frozen=True)
class Delivery:
    item_id: str
    token: str
    attempts: int
    key: str | None
    invoked: float  # when the lease call that returned it began
    deadline: float | None = None  # the lease deadline the node returned (epoch seconds)


@dataclass(frozen=True)
class Completion:
    item_id: str
    token: str
    outcome: str  # ACCEPTED, REFUSED or UNKNOWN
    returned: float  # when the completion call returned


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


class History:
    """What the clients saw. Safe to record into from several threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.acked: dict[str, set[str]] = defaultdict(set)  # key -> ids returned
        self.failed: set[str] = set()  # keys of produces that surely failed
        self.unknown: set[str] = set()  # keys sent at least once with no answer
        self.deliveries: list[Delivery] = []
        self.completions: list[Completion] = []

    # -- recording ----------------------------------------------------------------------

    def produced(self, keys: Sequence[str], ids: Sequence[str]) -> None:
        """A produce of ``keys`` was acknowledged with ``ids`` (in the same order)."""
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys but {len(ids)} ids")
        with self._lock:
            for key, item_id in zip(keys, ids, strict=True):
                self.acked[key].add(item_id)

    def produce_failed(self, keys: Iterable[str], *, unknown: bool) -> None:
        """A produce of ``keys`` failed: surely (``unknown=False``, e.g. a 400) or
        with an unknown outcome (a timeout, a 5xx, a dropped connection)."""
        with self._lock:
            (self.unknown if unknown else self.failed).update(keys)

    def delivered(self, item_id: str, token: str, attempts: int, *, key: str | None = None,
                  invoked: float | None = None, deadline: float | None = None) -> None:
        """A lease call that began at ``invoked`` returned this delivery, leased until
        ``deadline`` (epoch seconds, as the node said)."""
        at = self.clock() if invoked is None else invoked
        with self._lock:
            self.deliveries.append(Delivery(item_id, token, attempts, key, at, deadline))

    def completed(self, item_id: str, token: str, outcome: str) -> None:
        """A completion of one delivery returned ``outcome`` (ACCEPTED, REFUSED, UNKNOWN)."""
        if outcome not in (ACCEPTED, REFUSED, UNKNOWN):
            raise ValueError(f"unknown outcome {outcome!r}")
        with self._lock:
            self.completions.append(Completion(item_id, token, outcome, self.clock()))

    # -- questions while running --------------------------------------------------------

    def acked_ids(self) -> set[str]:
        with self._lock:
            return {i for ids in self.acked.values() for i in ids}

    def settled_ids(self) -> set[str]:
        """Items with a completion accepted or of unknown outcome."""
        with self._lock:
            return {c.item_id for c in self.completions if c.outcome != REFUSED}

    def outstanding(self) -> set[str]:
        """Acknowledged items not settled yet: what a drain still waits for."""
        return self.acked_ids() - self.settled_ids()

    # -- the check ------------------------------------------------------------------------

    def check(self, lease_timeout: float | None = None, tolerance: float = 0.05) -> Report:
        """The report; with ``lease_timeout`` (every lease's, no renewals), also the
        leases that began more than ``tolerance`` seconds before the previous one ended."""
        with self._lock:
            report = _Checker(self).report()
            if lease_timeout is not None:
                report.early_redeliveries = _early(self.deliveries, lease_timeout, tolerance)
            return report


class _Checker:
    """One pass over a (locked) history."""

    def __init__(self, h: History) -> None:
        self.h = h
        self.acked = {i for ids in h.acked.values() for i in ids}
        self.accepted: dict[str, set[str]] = defaultdict(set)  # id -> tokens accepted
        self.first_accept: dict[str, float] = {}
        self.unsure: set[str] = set()
        for c in h.completions:
            if c.outcome == ACCEPTED:
                self.accepted[c.item_id].add(c.token)
                self.first_accept[c.item_id] = min(c.returned,
                                                   self.first_accept.get(c.item_id, c.returned))
            elif c.outcome == UNKNOWN:
                self.unsure.add(c.item_id)

    def report(self) -> Report:
        h = self.h
        delivered = {d.item_id for d in h.deliveries}
        return Report(
            produced=len(self.acked),
            lost=sorted(self.acked - set(self.accepted) - self.unsure),
            uncertain=sorted((self.acked & self.unsure) - set(self.accepted)),
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
                if d.item_id in self.first_accept and d.invoked > self.first_accept[d.item_id]]

    def unexpected(self) -> list[str]:
        sent = set(self.h.acked) | self.h.unknown  # a produce that surely failed sent nothing
        return sorted({d.item_id for d in self.h.deliveries
                       if d.item_id not in self.acked and (d.key is None or d.key not in sent)})

    def duplicated_keys(self) -> list[str]:
        """Keys that became more than one item, by the acknowledgements and deliveries."""
        ids_of: dict[str, set[str]] = defaultdict(set)
        for key, ids in self.h.acked.items():
            ids_of[key] |= ids
        for d in self.h.deliveries:
            if d.key is not None:
                ids_of[d.key].add(d.item_id)
        return sorted(k for k, ids in ids_of.items() if len(ids) > 1)


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
