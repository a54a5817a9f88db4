"""Pure lease transitions: functions of (lease object, now, request).

They change the ``LeaseObject`` they are given (the caller hands each attempt a
copy of its own) by putting new item states in its slots, never by changing a
state in place (copies share their states), and raise
:class:`~okq.errors.LeaseLost` when the request names a delivery that is no
longer current. No I/O and no clock reads here.

An item's lifecycle inside its segment::

    fresh ──lease──▶ L(v+1) ──complete──▶ D
      │               │  ├──complete with outputs──▶ P ──outputs published──▶ D
      ▲               │  ├──retry──────▶ W(ready=retry_at) ──lease──▶ L(v+2) ...
      │               │  ├──expiry (t passes) ≡ W(ready=deadline)
      │               │  └──retry dead / max attempts──▶ X ──moved to DLQ──▶ Z
      └ scheduled items are fresh but not ready before enqueue_at

A delivery is current while the item is L with the token's ``v``; an expired
lease that nobody has re-leased is still current (no other delivery exists).
Completing a delivery that this same delivery already completed succeeds again
without a change, so a client may safely retry a completion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from okq.cell import Unchanged
from okq.errors import LeaseLost, OkqError
from okq.model import (
    DEAD,
    DEAD_PENDING,
    DONE,
    FINISHED,
    IN_FLIGHT,
    LEASED,
    OUTPUTS_PENDING,
    WAITING,
    ItemState,
    LeaseObject,
)


@dataclass(frozen=True, slots=True)
class Leased:
    index: int
    v: int
    attempts: int
    deadline_ms: int
    first_ms: int  # when the item was first leased


def ready_at(st: ItemState | None, fresh_ready_ms: int) -> int | None:
    """When the item can next be leased, or None if it never can (finished or moving)."""
    if st is None:
        return fresh_ready_ms
    if st.s in (LEASED, WAITING):
        return st.t
    return None


def is_available(st: ItemState | None, fresh_ready_ms: int, now: int) -> bool:
    r = ready_at(st, fresh_ready_ms)
    return r is not None and r <= now


def lease(
    obj: LeaseObject,
    wanted: list[tuple[int, int]],
    now: int,
    lease_ms: int,
    max_attempts: int,
    rq: str | None = None,
) -> tuple[list[Leased], list[int]]:
    """Lease each (index, fresh_ready_ms) still available at ``now``.

    Items that already had ``max_attempts`` deliveries are not leased but move to
    DEAD_PENDING; their indexes are returned second. ``rq`` (the request's id) is
    recorded in every state written, so that a request re-applied after an
    ambiguous write finds its own earlier lease: see :func:`recognise`.
    """
    leased: list[Leased] = []
    dead: list[int] = []
    if obj.sealed:  # the compactor is moving these items elsewhere
        return leased, dead
    for index, fresh_ready in wanted:
        st = obj.items.get(index)
        if not is_available(st, fresh_ready, now):
            continue
        v = st.v if st else 0
        attempts = st.attempts if st else 0
        if max_attempts and attempts >= max_attempts:
            err = st.err if st else None
            obj.items[index] = ItemState(DEAD_PENDING, v + 1, attempts, now, err, rq=rq)
            dead.append(index)
            continue
        first = st.first if st is not None and st.first is not None else now
        obj.items[index] = ItemState(LEASED, v + 1, attempts + 1, now + lease_ms, None, rq=rq,
                                     first=first)
        leased.append(Leased(index, v + 1, attempts + 1, now + lease_ms, first))
    return leased, dead


def recognise(
    obj: LeaseObject, wanted: list[tuple[int, int]], rq: str
) -> tuple[list[Leased], list[int], list[tuple[int, int]]]:
    """Split ``wanted`` into what request ``rq`` already leased (an earlier write
    of it landed although its writer saw an error), what it already moved to
    the dead-letter path, and the rest, still to try."""
    leased: list[Leased] = []
    dead: list[int] = []
    rest: list[tuple[int, int]] = []
    for index, fresh_ready in wanted:
        st = obj.items.get(index)
        if st is not None and st.rq == rq and st.s == LEASED:
            leased.append(Leased(index, st.v, st.attempts, st.t, st.first or st.t))
        elif st is not None and st.rq == rq and st.s in (DEAD_PENDING, DEAD):
            dead.append(index)
        else:
            rest.append((index, fresh_ready))
    return leased, dead, rest


def current(obj: LeaseObject, index: int, v: int) -> ItemState:
    """The item's state if delivery ``v`` is its current lease; else LeaseLost."""
    st = obj.items.get(index)
    if st is None or st.s != LEASED or st.v != v:
        state = "never leased" if st is None else _describe(st, v)
        raise LeaseLost(f"the lease is no longer held: the item is {state}", state=state)
    return st


#: How a lost lease describes an item that has left its queue (by whichever delivery).
GONE_STATES = {
    DONE: "already completed",
    OUTPUTS_PENDING: "already completed",
    DEAD_PENDING: "being dead-lettered",
    DEAD: "dead-lettered",
}


def _describe(st: ItemState, v: int) -> str:
    if st.s in GONE_STATES:  # whichever delivery took it out of the queue
        return GONE_STATES[st.s]
    if st.s == LEASED:
        return "leased again by another delivery"
    if st.v != v:
        return "released and leased again since"
    return "waiting for a retry" if st.s == WAITING else st.s


def left_queue(state: str) -> bool:
    """Whether a lost lease's ``state`` (LeaseLost's detail) says the item is no longer
    in its queue at all (completed, dead-lettered, compacted away or purged), rather
    than back in it or held by another delivery."""
    return state in GONE_STATES.values() or state in ("never leased", "gone")


def renew(obj: LeaseObject, index: int, v: int, now: int, lease_ms: int) -> int:
    st = current(obj, index, v)
    obj.items[index] = replace(st, t=now + lease_ms)
    return now + lease_ms


def complete(
    obj: LeaseObject, index: int, v: int, now: int = 0, out: list[Any] | None = None
) -> list[Any] | Unchanged | None:
    """L(v) -> D, or -> P (outputs pending) when the completion produces ``out``.

    Completing the same delivery again is a no-op (a retried request); the
    outputs recorded by the first completion are returned.
    """
    done = obj.items.get(index)
    if done is not None and done.s in (DONE, OUTPUTS_PENDING) and done.v == v:
        return Unchanged(done.out)
    st = current(obj, index, v)
    if out is None:
        obj.items[index] = ItemState(DONE, v, st.attempts, st.t, None)
    else:
        obj.items[index] = ItemState(OUTPUTS_PENDING, v, st.attempts, now, None, out)
    return out


def finish_outputs(obj: LeaseObject, index: int, v: int) -> Unchanged | None:
    """P(v) -> D once the outputs segment is published."""
    st = obj.items.get(index)
    if st is not None and st.s == OUTPUTS_PENDING and st.v == v:
        obj.items[index] = replace(st, s=DONE)
        return None
    return Unchanged()


def abandon_outputs(
    obj: LeaseObject, index: int, v: int, now: int, reason: str, back: bool = False
) -> bool | Unchanged:
    """P(v) -> X when its outputs can never be published: the completion did not
    take, and the item goes the way of a dead letter with ``reason``; or, with
    ``back``, P(v) -> W (ready now), the item waiting in its queue again."""
    st = obj.items.get(index)
    if st is not None and st.s == OUTPUTS_PENDING and st.v == v:
        state = WAITING if back else DEAD_PENDING
        obj.items[index] = ItemState(state, v, st.attempts, now, reason, first=st.first)
        return True
    return Unchanged(False)


def retry(
    obj: LeaseObject,
    index: int,
    v: int,
    now: int,
    retry_at_ms: int | None,
    dead: bool,
    error: str | None,
    max_attempts: int,
    count_attempt: bool = True,
    rq: str | None = None,
) -> bool | Unchanged:
    """Release the delivery. Returns True when the item must go to the dead-letter queue.

    With ``count_attempt=False`` the delivery is given back uncounted (a worker
    that is stopping and never ran it). A retry re-applied after its own
    ambiguous write landed (the state carries its ``rq``) changes nothing and
    answers as the first time.
    """
    st = obj.items.get(index)
    if rq is not None and st is not None and st.rq == rq and st.v == v:
        if st.s in (WAITING, DEAD_PENDING, DEAD):
            return Unchanged(st.s != WAITING)
    st = current(obj, index, v)
    attempts = retry_attempts(st, count_attempt)
    if dead or (max_attempts and attempts >= max_attempts):
        obj.items[index] = ItemState(DEAD_PENDING, v, attempts, now, error, rq=rq)
        return True
    ready = max(now, retry_at_ms or now)
    obj.items[index] = ItemState(WAITING, v, attempts, ready, error, rq=rq, first=st.first)
    return False


def retry_attempts(st: ItemState, count_attempt: bool) -> int:
    """The attempts an item has after its current delivery is released."""
    return st.attempts if count_attempt else max(0, st.attempts - 1)


def finish_dead(obj: LeaseObject, index: int, v: int) -> Unchanged | None:
    """DEAD_PENDING(v) -> DEAD once the item is in the dead-letter queue."""
    st = obj.items.get(index)
    if st is not None and st.s == DEAD_PENDING and st.v == v:
        obj.items[index] = replace(st, s=DEAD)
        return None
    return Unchanged()


def is_finished(st: ItemState | None) -> bool:
    return st is not None and st.s in FINISHED


def is_idle(st: ItemState | None, now: int) -> bool:
    """Live and held by nobody: fresh, waiting, or leased with the lease over (an
    expired lease that nobody re-leased is as good as waiting)."""
    return st is None or st.s == WAITING or (st.s == LEASED and st.t <= now)


def expire(obj: LeaseObject, indexes: list[int], now: int, to_dead: bool) -> list[int] | Unchanged:
    """Retention: each idle item of ``indexes`` -> Z (dropped) or, ``to_dead``, -> X
    (to be moved to the dead-letter queue). Returns the indexes expired; items
    leased or finished since they were chosen are left alone."""
    done = []
    for i in indexes:
        st = obj.items.get(i)
        if not is_idle(st, now):
            continue
        v, attempts = (st.v, st.attempts) if st else (0, 0)
        state = DEAD_PENDING if to_dead else DEAD
        obj.items[i] = ItemState(state, v + 1, attempts, now, "retention expired")
        done.append(i)
    return done if done else Unchanged([])


class SealRefused(OkqError):
    """A segment holds an item in flight: it cannot be sealed now."""


def seal(obj: LeaseObject) -> None:
    """Mark a segment to be merged elsewhere: refused while an item is in flight, so
    sealing is serialised with every lease (no token can then name a current
    delivery in it, and nothing in it is leased again)."""
    if any(st.s in IN_FLIGHT for st in obj.items.values()):
        raise SealRefused("an item is in flight")
    obj.sealed = True
