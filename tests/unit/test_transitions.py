"""The item state machine of okq/leases.py, one transition at a time."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from okq import leases as tr
from okq.changes import Unchanged
from okq.errors import LeaseLost
from okq.leases import (
    DEAD,
    DEAD_PENDING,
    DONE,
    LEASED,
    OUTPUTS_PENDING,
    WAITING,
    ItemState,
    LeaseObject,
)
from tests.engines import property_examples

#: Each test runs on the pure and the compiled hot path (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_path")

NOW = 1_700_000_000_000
LEASE_MS = 30_000


def snapshot(obj: LeaseObject) -> LeaseObject:
    """A deep copy to compare with later (a compiled LeaseObject has no deepcopy)."""
    return tr.decode_lease(tr.encode_lease(obj))


def leased_obj(index: int = 0, now: int = NOW, max_attempts: int = 0) -> tuple[LeaseObject, int]:
    """A lease object whose item ``index`` is leased (fresh -> L); returns (obj, v)."""
    obj = LeaseObject("seg")
    got, dead = tr.lease(obj, [(index, now)], now, LEASE_MS, max_attempts)
    assert dead == [] and len(got) == 1
    return obj, got[0].v


# -- fresh -> L ----------------------------------------------------------------


def test_fresh_item_is_leased() -> None:
    obj = LeaseObject("seg")
    got, dead = tr.lease(obj, [(3, NOW)], NOW, LEASE_MS, 0)
    assert dead == []
    assert got == [tr.Leased(index=3, v=1, attempts=1, deadline_ms=NOW + LEASE_MS, first_ms=NOW)]
    assert obj.items[3] == ItemState(LEASED, 1, 1, NOW + LEASE_MS, None, first=NOW)


def test_lease_takes_several_items_at_once() -> None:
    obj = LeaseObject("seg")
    got, _ = tr.lease(obj, [(0, NOW), (1, NOW - 5), (2, NOW)], NOW, LEASE_MS, 0)
    assert [g.index for g in got] == [0, 1, 2]
    assert all(obj.items[i].s == LEASED for i in range(3))


def test_scheduled_item_is_not_leased_before_its_time() -> None:
    obj = LeaseObject("seg")
    got, dead = tr.lease(obj, [(0, NOW + 1)], NOW, LEASE_MS, 0)
    assert (got, dead) == ([], [])
    assert obj.items == {}
    got, _ = tr.lease(obj, [(0, NOW + 1)], NOW + 1, LEASE_MS, 0)
    assert [g.index for g in got] == [0]


def test_lease_of_a_held_lease_is_a_noop() -> None:
    obj, _ = leased_obj()
    before = snapshot(obj)
    got, dead = tr.lease(obj, [(0, NOW)], NOW + LEASE_MS - 1, LEASE_MS, 0)
    assert (got, dead) == ([], [])
    assert obj == before


@pytest.mark.parametrize("state", [DONE, DEAD_PENDING, DEAD])
def test_lease_of_a_finished_or_moving_item_is_a_noop(state: str) -> None:
    obj = LeaseObject("seg", {0: ItemState(state, 4, 2, NOW - 10, "boom")})
    before = snapshot(obj)
    got, dead = tr.lease(obj, [(0, 0)], NOW + 10**9, LEASE_MS, 1)
    assert (got, dead) == ([], [])
    assert obj == before


def test_lease_of_a_waiting_item_before_its_retry_time_is_a_noop() -> None:
    obj = LeaseObject("seg", {0: ItemState(WAITING, 2, 1, NOW + 100, "e")})
    before = snapshot(obj)
    assert tr.lease(obj, [(0, 0)], NOW + 99, LEASE_MS, 0) == ([], [])
    assert obj == before


# -- L -> D --------------------------------------------------------------------


def test_complete_marks_done_and_keeps_v_and_attempts() -> None:
    obj, v = leased_obj()
    tr.complete(obj, 0, v)
    assert obj.items[0] == ItemState(DONE, v, 1, NOW + LEASE_MS, None)
    assert tr.is_finished(obj.items[0])
    assert tr.ready_at(obj.items[0], 0) is None


def test_completing_the_same_delivery_again_is_a_noop() -> None:
    obj, v = leased_obj()
    tr.complete(obj, 0, v)
    before = snapshot(obj)
    tr.complete(obj, 0, v)  # a retried request
    assert obj == before


@pytest.mark.parametrize("other_v", [0, 2])
def test_completing_a_done_item_with_another_v_is_refused(other_v: int) -> None:
    obj, v = leased_obj()
    assert v == 1
    tr.complete(obj, 0, v)
    before = snapshot(obj)
    with pytest.raises(LeaseLost):
        tr.complete(obj, 0, other_v)
    assert obj == before


def test_complete_after_expiry_but_not_released_succeeds() -> None:
    obj, v = leased_obj()
    # nobody leased it again: the expired delivery is still the current one
    tr.complete(obj, 0, v)
    assert obj.items[0].s == DONE


# -- L -> P -> D (completion with outputs) ----------------------------------------

OUT = ["orders-out", "018b5e3c2a00-0123456789", 2, NOW, 64]


def test_complete_with_outputs_goes_to_outputs_pending() -> None:
    obj, v = leased_obj()
    assert tr.complete(obj, 0, v, NOW + 3, OUT) == OUT
    assert obj.items[0] == ItemState(OUTPUTS_PENDING, v, 1, NOW + 3, None, OUT)
    assert not tr.is_finished(obj.items[0])
    assert tr.ready_at(obj.items[0], 0) is None
    assert tr.lease(obj, [(0, 0)], NOW + 10**9, LEASE_MS, 0) == ([], [])


def test_finish_outputs_with_matching_v_moves_p_to_d() -> None:
    obj, v = leased_obj()
    tr.complete(obj, 0, v, NOW + 3, OUT)
    tr.finish_outputs(obj, 0, v)
    assert obj.items[0].s == DONE and obj.items[0].v == v
    assert obj.items[0].out == OUT
    assert tr.is_finished(obj.items[0])


@pytest.mark.parametrize(
    "state",  # ItemState's arguments: made in the test, by the implementation under test
    [
        None,
        (OUTPUTS_PENDING, 2, 1, NOW, None, OUT),
        (LEASED, 1, 1, NOW, None),
        (DONE, 1, 1, NOW, None),
        (DEAD_PENDING, 1, 1, NOW, None),
    ],
)
def test_finish_outputs_only_acts_on_p_with_matching_v(state: tuple[Any, ...] | None) -> None:
    obj = LeaseObject("seg", {} if state is None else {0: ItemState(*state)})
    before = snapshot(obj)
    tr.finish_outputs(obj, 0, 1)
    assert obj == before


@pytest.mark.parametrize("finished", [False, True])
def test_completing_with_outputs_again_returns_the_first_outputs(finished: bool) -> None:
    obj, v = leased_obj()
    tr.complete(obj, 0, v, NOW + 3, OUT)
    if finished:
        tr.finish_outputs(obj, 0, v)
    before = snapshot(obj)
    # a no-op: Unchanged tells the cell not to write, and carries the first outputs
    assert tr.complete(obj, 0, v, NOW + 9, ["other", "x", 1, 1, 1]) == Unchanged(OUT)
    assert tr.complete(obj, 0, v) == Unchanged(OUT)
    assert obj == before


def test_plain_completion_again_returns_no_outputs() -> None:
    obj, v = leased_obj()
    assert tr.complete(obj, 0, v) is None
    assert tr.complete(obj, 0, v, NOW, OUT) == Unchanged(None)
    assert obj.items[0].s == DONE and obj.items[0].out is None


# -- sealed lease objects -----------------------------------------------------------


def test_sealed_object_leases_nothing() -> None:
    obj = LeaseObject(
        "seg",
        {1: ItemState(WAITING, 1, 1, NOW - 1, None), 2: ItemState(WAITING, 1, 3, NOW, None)},
        sealed=True,
    )
    before = snapshot(obj)
    assert tr.lease(obj, [(0, NOW - 5), (1, 0), (2, 0)], NOW, LEASE_MS, 3) == ([], [])
    assert obj == before


# -- L -> W ----------------------------------------------------------------------


def test_retry_waits_until_retry_at() -> None:
    obj, v = leased_obj()
    assert tr.retry(obj, 0, v, NOW + 5, NOW + 1_000, False, "nope", 0) is False
    assert obj.items[0] == ItemState(WAITING, v, 1, NOW + 1_000, "nope", first=NOW)
    assert not tr.is_available(obj.items[0], 0, NOW + 999)
    assert tr.is_available(obj.items[0], 0, NOW + 1_000)


@pytest.mark.parametrize("retry_at", [None, 0, NOW - 1_000, NOW + 5])
def test_retry_at_in_the_past_or_missing_is_clamped_to_now(retry_at: int | None) -> None:
    obj, v = leased_obj()
    assert tr.retry(obj, 0, v, NOW + 5, retry_at, False, None, 0) is False
    assert obj.items[0].s == WAITING
    assert obj.items[0].t == NOW + 5


def test_waiting_item_is_leased_again_with_next_v() -> None:
    obj, v = leased_obj()
    tr.retry(obj, 0, v, NOW, NOW + 10, False, "e", 0)
    got, _ = tr.lease(obj, [(0, 0)], NOW + 10, LEASE_MS, 0)
    # the first lease's time is kept: SQS's ApproximateFirstReceiveTimestamp
    assert got == [tr.Leased(0, v + 1, 2, NOW + 10 + LEASE_MS, NOW)]
    assert obj.items[0] == ItemState(LEASED, v + 1, 2, NOW + 10 + LEASE_MS, None, first=NOW)


# -- expiry ≡ W at the deadline --------------------------------------------------


def test_expired_lease_is_ready_exactly_at_its_deadline() -> None:
    obj, v = leased_obj()
    deadline = NOW + LEASE_MS
    st_ = obj.items[0]
    assert tr.ready_at(st_, 0) == deadline
    assert not tr.is_available(st_, 0, deadline - 1)
    assert tr.is_available(st_, 0, deadline)
    waiting = ItemState(WAITING, v, 1, deadline, None)
    for now in (deadline - 1, deadline, deadline + 1):
        assert tr.is_available(st_, 0, now) == tr.is_available(waiting, 0, now)
    assert tr.lease(obj, [(0, 0)], deadline - 1, LEASE_MS, 0) == ([], [])
    got, _ = tr.lease(obj, [(0, 0)], deadline, LEASE_MS, 0)
    assert got == [tr.Leased(0, v + 1, 2, deadline + LEASE_MS, NOW)]


def test_expired_then_released_lease_is_lost_to_the_new_delivery() -> None:
    obj, v = leased_obj()
    tr.lease(obj, [(0, 0)], NOW + LEASE_MS, LEASE_MS, 0)
    with pytest.raises(LeaseLost, match="leased again"):
        tr.complete(obj, 0, v)


# -- L -> X -> Z -----------------------------------------------------------------


def test_retry_dead_goes_to_dead_pending() -> None:
    obj, v = leased_obj()
    assert tr.retry(obj, 0, v, NOW + 7, NOW + 1_000, True, "poison", 0) is True
    assert obj.items[0] == ItemState(DEAD_PENDING, v, 1, NOW + 7, "poison")
    assert tr.ready_at(obj.items[0], 0) is None
    assert not tr.is_finished(obj.items[0])


def test_retry_at_max_attempts_goes_to_dead_pending() -> None:
    obj, v = leased_obj(max_attempts=2)
    assert tr.retry(obj, 0, v, NOW, None, False, "e1", 2) is False
    got, _ = tr.lease(obj, [(0, 0)], NOW, LEASE_MS, 2)
    assert got[0].attempts == 2
    assert tr.retry(obj, 0, got[0].v, NOW + 1, None, False, "e2", 2) is True
    assert obj.items[0] == ItemState(DEAD_PENDING, got[0].v, 2, NOW + 1, "e2")


def test_lease_after_max_attempts_expired_goes_to_dead_pending() -> None:
    obj, v = leased_obj(max_attempts=1)
    deadline = NOW + LEASE_MS
    got, dead = tr.lease(obj, [(0, 0)], deadline, LEASE_MS, 1)
    assert got == [] and dead == [0]
    # the lease bumps v so the expired delivery can no longer act
    assert obj.items[0] == ItemState(DEAD_PENDING, v + 1, 1, deadline, None)
    with pytest.raises(LeaseLost):
        tr.complete(obj, 0, v)


def test_lease_after_max_attempts_keeps_the_last_error() -> None:
    obj, v = leased_obj(max_attempts=1)
    obj.items[0] = ItemState(WAITING, v, 1, NOW, "last error")
    got, dead = tr.lease(obj, [(0, 0)], NOW, LEASE_MS, 1)
    assert (got, dead) == ([], [0])
    assert obj.items[0].err == "last error"


def test_max_attempts_zero_is_unlimited() -> None:
    obj = LeaseObject("seg")
    now = NOW
    for n in range(1, 60):
        got, dead = tr.lease(obj, [(0, 0)], now, LEASE_MS, 0)
        assert dead == [] and got[0].attempts == n
        assert tr.retry(obj, 0, got[0].v, now, None, False, "e", 0) is False
    assert obj.items[0].s == WAITING and obj.items[0].attempts == 59


def test_finish_dead_with_matching_v_moves_x_to_z() -> None:
    obj, v = leased_obj()
    tr.retry(obj, 0, v, NOW, None, True, "poison", 0)
    tr.finish_dead(obj, 0, v)
    assert obj.items[0] == ItemState(DEAD, v, 1, NOW, "poison")
    assert tr.is_finished(obj.items[0])


@pytest.mark.parametrize("wrong_v", [0, 2, 99])
def test_finish_dead_with_other_v_is_a_noop(wrong_v: int) -> None:
    obj, v = leased_obj()
    assert v == 1
    tr.retry(obj, 0, v, NOW, None, True, "poison", 0)
    before = snapshot(obj)
    tr.finish_dead(obj, 0, wrong_v)
    assert obj == before


@pytest.mark.parametrize(
    "state",  # ItemState's arguments: made in the test, by the implementation under test
    [
        None,
        (LEASED, 1, 1, NOW, None),
        (WAITING, 1, 1, NOW, None),
        (DONE, 1, 1, NOW, None),
        (DEAD, 1, 1, NOW, None),
    ],
)
def test_finish_dead_only_acts_on_dead_pending(state: tuple[Any, ...] | None) -> None:
    obj = LeaseObject("seg", {} if state is None else {0: ItemState(*state)})
    before = snapshot(obj)
    tr.finish_dead(obj, 0, 1)
    assert obj == before


# -- renew -----------------------------------------------------------------------


def test_renew_extends_from_now() -> None:
    obj, v = leased_obj()
    assert tr.renew(obj, 0, v, NOW + 10, 5_000) == NOW + 10 + 5_000
    assert obj.items[0] == ItemState(LEASED, v, 1, NOW + 10 + 5_000, None, first=NOW)


def test_renew_after_expiry_but_not_released_succeeds() -> None:
    obj, v = leased_obj()
    late = NOW + LEASE_MS * 3
    assert tr.renew(obj, 0, v, late, LEASE_MS) == late + LEASE_MS
    assert obj.items[0].s == LEASED and obj.items[0].v == v
    assert not tr.is_available(obj.items[0], 0, late)


# -- stale deliveries are refused and leave the object alone ---------------------

OPS: dict[str, Callable[[LeaseObject, int], object]] = {
    "complete": lambda o, v: tr.complete(o, 0, v),
    "renew": lambda o, v: tr.renew(o, 0, v, NOW + 1, LEASE_MS),
    "retry": lambda o, v: tr.retry(o, 0, v, NOW + 1, None, False, "e", 0),
    "retry_dead": lambda o, v: tr.retry(o, 0, v, NOW + 1, None, True, "e", 0),
}


def _stale_situations() -> list[tuple[str, LeaseObject, int, str]]:
    """(label, object, stale v, expected words in the message)."""
    out: list[tuple[str, LeaseObject, int, str]] = []
    out.append(("never leased", LeaseObject("seg"), 1, "never leased"))
    # re-leased by another delivery
    o, v = leased_obj()
    tr.lease(o, [(0, 0)], NOW + LEASE_MS, LEASE_MS, 0)
    out.append(("re-leased", o, v, "leased again by another delivery"))
    # retried and leased again since, then waiting again
    o, v = leased_obj()
    tr.retry(o, 0, v, NOW, None, False, None, 0)
    got, _ = tr.lease(o, [(0, 0)], NOW, LEASE_MS, 0)
    tr.retry(o, 0, got[0].v, NOW, None, False, None, 0)
    out.append(("released since", o, v, "released and leased again"))
    o, v = leased_obj()
    tr.retry(o, 0, v, NOW, NOW + 50, False, None, 0)
    out.append(("waiting", o, v, "waiting for a retry"))
    o, v = leased_obj()
    tr.complete(o, 0, v)
    out.append(("done", o, v, "already completed"))
    o, v = leased_obj()
    tr.lease(o, [(0, 0)], NOW + LEASE_MS, LEASE_MS, 0)
    tr.complete(o, 0, v + 1)
    out.append(("done by another delivery", o, v, "already completed"))
    o, v = leased_obj()
    tr.retry(o, 0, v, NOW, None, True, None, 0)
    out.append(("dead pending", o, v, "being dead-lettered"))
    o, v = leased_obj()
    tr.retry(o, 0, v, NOW, None, True, None, 0)
    tr.finish_dead(o, 0, v)
    out.append(("dead", o, v, "dead-lettered"))
    o, v = leased_obj()
    tr.complete(o, 0, v, NOW, OUT)
    out.append(("outputs pending", o, v, "already completed"))
    o, v = leased_obj()
    tr.complete(o, 0, v, NOW, OUT)
    tr.finish_outputs(o, 0, v)
    out.append(("outputs published", o, v, "already completed"))
    o, v = leased_obj()
    out.append(("future v", o, v + 1, "leased again by another delivery"))
    return out


# completing the delivery that completed the item is an idempotent no-op
IDEMPOTENT = ("done", "outputs pending", "outputs published")


@pytest.mark.parametrize(
    ("op", "label"),
    [
        pytest.param(op, label, id=f"{label}-{op}")
        for label, _, _, _ in _stale_situations()
        for op in sorted(OPS)
        if not (op == "complete" and label in IDEMPOTENT)
    ],
)
def test_stale_delivery_is_refused_and_object_unchanged(op: str, label: str) -> None:
    # made here, not at import: the objects are the implementation's under test
    [(obj, v, words)] = [(o, v, w) for name, o, v, w in _stale_situations() if name == label]
    obj = snapshot(obj)
    before = snapshot(obj)
    with pytest.raises(LeaseLost, match=words) as info:
        OPS[op](obj, v)
    assert info.value.details["state"] in info.value.message
    assert obj == before


# -- random sequences --------------------------------------------------------------

N_ITEMS = 3

INDEX = st.integers(0, N_ITEMS - 1)
DV = st.sampled_from([0, 0, 0, -1, 1])  # mostly the current delivery, sometimes not
LEASE_OP = st.tuples(st.just("lease"), st.sets(INDEX, min_size=1), st.sampled_from([0, 0, 1, 2]))

op_strategy = st.one_of(
    LEASE_OP,
    LEASE_OP,
    st.tuples(st.just("complete"), INDEX, DV),
    st.tuples(st.just("renew"), INDEX, DV),
    st.tuples(
        st.just("retry"),
        INDEX,
        DV,
        st.booleans(),
        st.one_of(st.none(), st.integers(-50_000, 50_000)),
    ),
    st.tuples(st.just("retry"), INDEX, DV, st.booleans(), st.none()),
    st.tuples(st.just("finish_dead"), INDEX, DV),
    st.tuples(st.just("complete_out"), INDEX, DV),
    st.tuples(st.just("finish_outputs"), INDEX, DV),
    st.tuples(st.just("seal"), st.integers(0, 9)),  # seals one time in ten
    st.tuples(st.just("advance"), st.integers(0, 2 * LEASE_MS)),
)


def _apply(obj: LeaseObject, op: tuple[Any, ...], now: int, max_attempts: int) -> int:
    """Apply one random operation; return the new ``now``. May raise LeaseLost."""
    kind = op[0]
    if kind == "advance":
        return now + int(op[1])
    if kind == "seal":  # the compactor seals only when nothing is leased or moving
        if op[1] == 0 and not any(s.s in (LEASED, DEAD_PENDING) for s in obj.items.values()):
            obj.sealed = True
        return now
    if kind == "lease":
        idxs, ready_offset = op[1], op[2]
        wanted = [(i, now - 1 + int(ready_offset)) for i in sorted(idxs)]
        tr.lease(obj, wanted, now, LEASE_MS, max_attempts)
        return now
    index, dv = int(op[1]), int(op[2])
    st_ = obj.items.get(index)
    v = (st_.v if st_ else 1) + dv  # the current v, or a stale / future one
    if kind == "complete":
        tr.complete(obj, index, v)
    elif kind == "complete_out":
        tr.complete(obj, index, v, now, ["out", "seg", 1, now, 1])
    elif kind == "finish_outputs":
        tr.finish_outputs(obj, index, v)
    elif kind == "renew":
        tr.renew(obj, index, v, now, LEASE_MS)
    elif kind == "retry":
        _, _, _, dead, delay = op
        at = None if delay is None else now + int(delay)
        tr.retry(obj, index, v, now, at, bool(dead), "err", max_attempts)
    elif kind == "finish_dead":
        tr.finish_dead(obj, index, v)
    else:  # pragma: no cover
        raise AssertionError(kind)
    return now


#: Every state change the docstring's diagram allows (fresh -> L is checked apart).
ALLOWED = {
    (LEASED, DONE),
    (LEASED, OUTPUTS_PENDING),
    (LEASED, WAITING),
    (LEASED, DEAD_PENDING),
    (WAITING, LEASED),
    (WAITING, DEAD_PENDING),
    (OUTPUTS_PENDING, DONE),
    (DEAD_PENDING, DEAD),
}


@settings(max_examples=property_examples(120, 300), deadline=None)
@given(ops=st.lists(op_strategy, max_size=40), max_attempts=st.integers(0, 3))
def test_random_sequences_keep_the_invariants(
    ops: list[tuple[Any, ...]], max_attempts: int
) -> None:
    obj = LeaseObject("seg")
    now = NOW
    for op in ops:
        before = snapshot(obj)
        try:
            now = _apply(obj, op, now, max_attempts)
        except LeaseLost:
            assert obj == before, "a refused operation changed the object"
            continue
        for i in range(N_ITEMS):
            old, new = before.items.get(i), obj.items.get(i)
            if old is None:
                if new is not None:
                    assert op[0] == "lease" and not before.sealed
                    assert new.v == 1
                    assert (new.s, new.attempts) == (LEASED, 1)
                continue
            assert new is not None, "an item state disappeared"
            assert new.v >= old.v, "v decreased"
            if old.s in (DONE, DEAD):
                assert new == old, f"terminal state {old.s} changed"
            if new.s != old.s:
                assert (old.s, new.s) in ALLOWED, f"{old.s} -> {new.s} by {op[0]}"
            if new.attempts != old.attempts:
                assert op[0] == "lease", f"attempts changed by {op[0]}"
                assert new.attempts == old.attempts + 1
            if new.v != old.v:
                assert op[0] == "lease" and new.v == old.v + 1
            if before.sealed:
                assert op[0] != "lease" or new == old, "a sealed object leased an item"
            if max_attempts:
                assert new.attempts <= max_attempts


def test_a_segment_is_all_finished_when_each_item_is_done_or_dead() -> None:
    done, dead = tr.ItemState(tr.DONE, 1, 1, 0), tr.ItemState(tr.DEAD, 2, 2, 0)
    leased = tr.ItemState(tr.LEASED, 1, 1, 0)
    assert tr.all_finished(tr.LeaseObject("s", {0: done, 1: dead}), 2)
    assert tr.all_finished(tr.LeaseObject("s", {0: done, 1: dead, 2: leased}), 2)  # past count
    assert not tr.all_finished(tr.LeaseObject("s", {0: done}), 2)  # item 1 never leased
    assert not tr.all_finished(tr.LeaseObject("s", {0: done, 1: leased}), 2)
    assert not tr.all_finished(tr.LeaseObject("s", {0: done, 1: dead}, sealed=True), 2)


@pytest.mark.parametrize("seed", range(40))
def test_a_summarys_candidates_are_every_ready_state_and_fresh_item_in_order(seed: int) -> None:
    """Candidates of states and of fresh items are sorted apart and joined: the same
    list as sorting them all, whether they interleave or not."""
    rng = random.Random(seed)
    count = rng.randint(1, 30) if seed % 4 else rng.randint(250, 600)  # indexes past 256 too
    base = rng.choice([0, 1_000, 5_000])  # fresh items before, among or after the states
    fresh = sorted((base + rng.randint(0, 3) * 100, n, 0) for n in range(count))
    kinds = [tr.LEASED, tr.WAITING, tr.DONE, tr.DEAD, tr.DEAD_PENDING, tr.OUTPUTS_PENDING]
    states = {n: tr.ItemState(rng.choice(kinds), 1, 1, rng.randint(0, 6_000))
              for n in rng.sample(range(count), rng.randint(0, count))}
    if len(states) < count - 1 and seed % 2:
        states[count + 1] = tr.ItemState(tr.LEASED, 1, 1, 0)  # past the segment: not its
    ready, inflight, stalled = tr.summarise(tr.LeaseObject("s", dict(states)), count, fresh)
    mine = {n: st for n, st in states.items() if n < count}
    want = sorted([(st.t, n, st.t) for n, st in mine.items()
                   if st.s in tr.READY_STATES]
                  + [c for c in fresh if c[1] not in states])
    assert ready == want
    # the states are classed as the sets say
    assert inflight == any(st.s in tr.IN_FLIGHT for st in mine.values())
    assert stalled == sorted(((st.t, n) for n, st in mine.items() if st.s in tr.HALF_DONE),
                             key=lambda e: e[1])


@pytest.mark.parametrize("seed", range(60))
def test_complete_many_is_complete_for_each_delivery_in_turn(seed: int) -> None:
    """The batch form answers each delivery as complete() would, in its order (a
    delivery named twice is completed, then completed again without a change),
    leaves the same states, and is Unchanged exactly when none was completed now."""
    rng = random.Random(seed)
    kinds = [tr.LEASED, tr.WAITING, tr.DONE, tr.DEAD, tr.DEAD_PENDING, tr.OUTPUTS_PENDING]
    states = {n: tr.ItemState(rng.choice(kinds), rng.randint(1, 3), 1, NOW)
              for n in rng.sample(range(300), rng.randint(0, 40))}
    pool = list(states) + [rng.randint(0, 299) for _ in range(3)]
    ds = [SimpleNamespace(index=rng.choice(pool), v=rng.randint(1, 3))
          for _ in range(rng.randint(1, 30))]
    batch, one_by_one = LeaseObject("s", dict(states)), LeaseObject("s", dict(states))
    got = tr.complete_many(batch, ds)
    want: list[Any] = []
    changed = False
    for d in ds:
        try:
            changed |= not isinstance(tr.complete(one_by_one, d.index, d.v), Unchanged)
            want.append(None)
        except LeaseLost as exc:
            want.append(exc)
    assert isinstance(got, Unchanged) == (not changed)
    answers = got.value if isinstance(got, Unchanged) else got
    assert [None if a is None else (type(a), str(a), a.details) for a in answers] == \
        [None if w is None else (type(w), str(w), w.details) for w in want]
    assert batch.items == one_by_one.items


def walk_reference(ready: list[tuple[int, int, int]], now: int, horizon: int,
                   fresh_until: int, n: int, next_ready: int | None, penalty: int
                   ) -> tuple[list[tuple[int, str, int, int, str]], int | None]:
    """The standard walk through one segment as okq/scheduler.py ``_pick`` wrote it
    before the loop moved to okq.leases.take_ready."""
    cands: list[tuple[int, str, int, int, str]] = []
    for order, idx, due in ready:
        if due > now or order > horizon:
            if order > fresh_until and order > now:
                next_ready = order if next_ready is None else min(next_ready, order)
                break
            soon = max(due, order) if order > horizon else due
            next_ready = soon if next_ready is None else min(next_ready, soon)
            if order > horizon:
                break
            continue
        cands.append((order + penalty, "seg", idx, due, "sm"))
        if len(cands) == n:
            break
    return cands, next_ready


@pytest.mark.parametrize("seed", range(80))
def test_take_ready_walks_a_segment_as_the_scheduler_did(seed: int) -> None:
    rng = random.Random(seed)
    now = 10_000
    ready = sorted((rng.randint(now - 3_000, now + 3_000), i,
                    rng.choice([0, rng.randint(now - 3_000, now + 3_000)]))
                   for i in range(rng.randint(0, 60)))
    fresh_until = rng.choice([-1, now - 1_000, now + 1_000])
    horizon = now + rng.choice([0, 500, 5_000])
    n = rng.randint(1, 30)
    before = rng.choice([None, now + 2_000, now - 10])
    penalty = rng.choice([0, 100])
    into: list[Any] = [("earlier",)]  # candidates of segments walked before: kept
    taken, next_ready = tr.take_ready(ready, now, horizon, fresh_until, n, before, into,
                                      penalty, "seg", "sm")
    want, want_next = walk_reference(ready, now, horizon, fresh_until, n, before, penalty)
    assert (into[1:], next_ready, taken) == (want, want_next, len(want))
    assert into[0] == ("earlier",)
    groups = tr.by_segment([*into[1:], (1, "other", 7, 0, "sm2"), (2, "seg", 99, 5, "sm")])
    assert list(groups) == (["seg", "other"] if want else ["other", "seg"])
    assert groups["seg"] == ("sm", [(c[2], c[3]) for c in want] + [(99, 5)])
    assert groups["other"] == ("sm2", [(7, 0)])
