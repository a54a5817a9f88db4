"""The order rules of the client-history checker (tests/history.py ``check_order``) on
hand-made histories of an ordered (fifo) queue: legitimate ones (several items of a
group in one handout, an expired head leased again first, refused and unknown
completions, ambiguous produces, a dead-lettered head) report nothing, and each
rule catches what it is for.

Times are given explicitly: the history's clock is a number the test sets, and the
wall clock (the nodes' lease deadlines) is it plus ``WALL``.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence

import pytest

from tests.history import ACCEPTED, REFUSED, UNKNOWN, History

WALL = 1_700_000_000.0  # the wall clock at history time 0
LEASE = 3.0  # every lease's timeout


class Run:
    """A history and the clock it reads; the helpers set the clock first."""

    def __init__(self) -> None:
        self.now = 0.0
        self.h = History(clock=lambda: self.now, wall=lambda: WALL + self.now)
        self.tokens = itertools.count(1)

    def produce(self, keys: Sequence[str], groups: Sequence[str | None], sent: float,
                acked: float | None = None, *, unknown: bool = False) -> None:
        """One attempt of a produce of ``keys``: sent at ``sent``, acknowledged at
        ``acked`` (the ids are the keys), or with an unknown outcome."""
        self.now = sent
        self.h.sending(keys, groups)
        if unknown:
            self.h.produce_failed(keys, unknown=True)
        else:
            assert acked is not None
            self.now = acked
            self.h.produced(keys, list(keys))

    def lease(self, keys: Sequence[str], began: float, returned: float,
              lease: float = LEASE) -> list[str]:
        """One lease call that got ``keys`` (ids are keys), in this order; the tokens."""
        call = self.h.new_call()
        tokens = []
        for n, key in enumerate(keys):
            token = f"{key}-t{next(self.tokens)}"
            self.h.delivered(key, token, 1, key=key, invoked=began, returned=returned,
                             returned_wall=WALL + returned,
                             deadline=WALL + (began + returned) / 2 + lease,
                             call=call, index=n)
            tokens.append(token)
        return tokens

    def complete(self, key: str, token: str, outcome: str, sent: float,
                 returned: float) -> None:
        self.now = returned
        self.h.completed(key, token, outcome, sent=sent)

    def lease_and_complete(self, keys: Sequence[str], at: float) -> None:
        """A lease at ``at`` and its completion, accepted, right after."""
        for key, token in zip(keys, self.lease(keys, at, at + 0.1), strict=True):
            self.complete(key, token, ACCEPTED, at + 0.2, at + 0.3)


def clean(r: Run, **kw: bool) -> None:
    """0 violations, 0 lost: the base of every legitimate history."""
    order = r.h.check_order(**kw)
    assert order.violations == 0, (order.summary(), order)
    report = r.h.check()
    assert report.ok and not report.lost, report.summary()


# -- legitimate histories ------------------------------------------------------------------


def test_items_handed_out_in_order_one_handout_at_a_time_report_nothing() -> None:
    r = Run()
    r.produce(["a1", "b1"], ["a", "b"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    r.produce(["a3", "b2"], ["a", "b"], 3, 3.5)
    r.lease_and_complete(["a1", "b1"], 4)  # two groups in one call
    r.lease_and_complete(["a2"], 5)
    r.lease_and_complete(["b2", "a3"], 6)  # no order between groups
    clean(r)
    order = r.h.check_order()
    assert order.groups == {"a": 3, "b": 2}
    assert order.checked == 3  # a2 (after a1), a3 (after a1, a2), b2 (after b1)


def test_several_items_of_a_group_in_one_handout_in_order() -> None:
    r = Run()
    r.produce(["a1", "a2"], ["a", "a"], 1, 1.5)  # in order within one produce
    r.produce(["a3"], ["a"], 2, 2.5)
    r.lease_and_complete(["a1", "a2", "a3"], 3)
    clean(r)


def test_an_expired_head_is_leased_again_first_and_a_late_completion_refused() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (stale,) = r.lease(["a1"], 3, 3.1)  # a consumer stops: its lease runs out at 6
    again = r.lease(["a1", "a2"], 6.5, 6.6)  # the head first, and the next with it
    r.complete("a1", again[0], ACCEPTED, 6.7, 6.8)
    r.complete("a2", again[1], ACCEPTED, 6.7, 6.8)
    r.complete("a1", stale, REFUSED, 5.0, 9.0)  # sent while stopped: answered too late
    clean(r)


def test_a_head_leased_again_after_expiry_alone_then_the_next() -> None:
    r = Run()
    r.produce(["a1", "a2"], ["a", "a"], 1, 1.5)
    first = r.lease(["a1", "a2"], 2, 2.1)  # lost: both run out at 5
    (head,) = r.lease(["a1"], 5.5, 5.6)  # a batch full after the head
    # the old completion of a2 lands (its lease was over but nobody had taken it)
    r.complete("a1", first[0], REFUSED, 5.7, 5.8)
    r.complete("a2", first[1], ACCEPTED, 5.7, 5.8)
    r.complete("a1", head, ACCEPTED, 5.9, 6.0)
    clean(r)


def test_a_completion_of_unknown_outcome_may_have_finished_the_head() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (t1,) = r.lease(["a1"], 3, 3.1)
    r.complete("a1", t1, UNKNOWN, 3.2, 13.2)  # a 502 after 10 s: did it land?
    r.lease_and_complete(["a2"], 4)  # it did, at once
    order = r.h.check_order()
    assert order.violations == 0 and order.checked == 1, order


def test_a_refused_completion_retried_after_an_ambiguous_one() -> None:
    """The load's retry of a completion whose first try was ambiguous: only its final
    answer counts, and its first send bounds it."""
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (t1,) = r.lease(["a1"], 3, 3.1)
    r.complete("a1", t1, ACCEPTED, 3.2, 9.0)  # the first try timed out, the second said yes
    r.lease_and_complete(["a2"], 4)  # after the first try landed
    clean(r)


def test_an_ambiguous_produce_orders_nothing_before_its_acknowledgement() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, unknown=True)  # it landed at once ...
    r.produce(["a2"], ["a"], 2, 2.5)  # ... so a2 is after it
    r.produce(["a1"], ["a"], 3, 3.5)  # the retry, answered with a1's first id
    r.lease_and_complete(["a1"], 4)
    r.lease_and_complete(["a2"], 5)
    clean(r)
    # the other way round is as legitimate: a1's first landing may have been its retry
    r = Run()
    r.produce(["a1"], ["a"], 1, unknown=True)
    r.produce(["a2"], ["a"], 2, 2.5)
    r.produce(["a1"], ["a"], 3, 3.5)
    r.lease_and_complete(["a2"], 4)
    r.lease_and_complete(["a1"], 5)
    clean(r)


def test_a_produce_never_acknowledged_orders_nothing() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, unknown=True)  # landed, never acknowledged
    r.produce(["a2"], ["a"], 2, 2.5)
    r.lease_and_complete(["a2"], 4)
    r.lease_and_complete(["a1"], 5)
    order = r.h.check_order()
    assert order.violations == 0 and order.checked == 0, order


def test_a_dead_lettered_head_unblocks_its_group() -> None:
    """With dead letters the head's end cannot be seen: a later item handed out while
    the head was never completed is legitimate."""
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    r.lease(["a1"], 3, 3.1)  # its last attempt: runs out at 6, then dead-lettered
    r.lease_and_complete(["a2"], 7)
    order = r.h.check_order(dead_letters=True)
    assert order.violations == 0 and order.checked == 1, order
    # without dead letters a1 was never finished: a2 could not come out
    assert r.h.check_order().out_of_order == [("a2", "a2-t2", "a1")]


def test_a_reply_holding_a_second_handout_of_an_expired_group() -> None:
    """A lease call whose passes outlast a lease: the group handed out, its lease over
    within the call, and handed out again from its head later in the same reply."""
    r = Run()
    r.produce(["a1", "a2"], ["a", "a"], 1, 1.5)
    tokens = r.lease(["a1", "a2", "b0", "a1", "a2"], 2, 12)
    for key, token in zip(["a1", "a2"], tokens[3:], strict=True):
        r.complete(key, token, ACCEPTED, 12.1, 12.2)
    order = r.h.check_order()
    assert order.violations == 0, order


def test_handouts_of_different_groups_overlap_freely() -> None:
    r = Run()
    r.produce(["a1", "b1"], ["a", "b"], 1, 1.5)
    (ta,) = r.lease(["a1"], 2, 2.1)
    (tb,) = r.lease(["b1"], 2.2, 2.3)
    r.complete("a1", ta, ACCEPTED, 2.5, 2.6)
    r.complete("b1", tb, ACCEPTED, 2.5, 2.6)
    clean(r)


@pytest.mark.parametrize(("returned", "reported"), [(5.06, False), (5.04, True)])
def test_a_group_handed_out_again_about_a_lease_deadline(returned: float,
                                                          reported: bool) -> None:
    """A lease that returned within the tolerance (0.05 s) of the deadline the node
    gave an earlier handout of the group is given the benefit of the doubt."""
    r = Run()
    r.produce(["a1"], ["a"], 1, unknown=True)  # no order between a1 and a2
    r.produce(["a2"], ["a"], 1.1, unknown=True)
    (t1,) = r.lease(["a1"], 2, 2.2)  # leased until 2.1 + 3 (the middle of its call)
    (t2,) = r.lease(["a2"], 4.9, returned)
    r.complete("a2", t2, ACCEPTED, 5.2, 5.3)
    order = r.h.check_order()
    assert order.two_in_flight == ([("a2", t2, "a1", t1)] if reported else []), order


def test_a_large_legitimate_history_is_checked_quickly() -> None:
    """Thousands of items, their groups random: one handout at a time per group, the
    next lease after the last completion was sent."""
    rng = random.Random(7)
    r = Run()
    keys = [f"k{n}" for n in range(8_000)]
    groups = [f"g{rng.randrange(8)}" for _ in keys]
    for n in range(0, len(keys), 5):
        r.produce(keys[n:n + 5], groups[n:n + 5], n, n + 0.5)
    t = float(len(keys))
    for n in range(0, len(keys), 20):
        r.lease_and_complete(keys[n:n + 20], t)  # in order across all groups
        t += 1
    began = time.monotonic()
    order = r.h.check_order()
    assert order.violations == 0 and order.checked > 7_500, order.summary()
    assert time.monotonic() - began < 20


# -- violations --------------------------------------------------------------------------------


def test_an_item_handed_out_before_the_earlier_one_finished_is_out_of_order() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (t2,) = r.lease(["a2"], 3, 3.1)  # a1 is not leased, not finished
    r.complete("a2", t2, ACCEPTED, 3.2, 3.3)
    r.lease_and_complete(["a1"], 4)
    order = r.h.check_order()
    assert order.out_of_order == [("a2", t2, "a1")], order
    assert order.violations == 1 and order.two_in_flight == []


def test_out_of_order_within_one_produce() -> None:
    r = Run()
    r.produce(["a1", "b1", "a2"], ["a", "b", "a"], 1, 1.5)
    (t2,) = r.lease(["a2"], 2, 2.1)
    r.complete("a2", t2, ACCEPTED, 2.2, 2.3)
    r.lease_and_complete(["b1", "a1"], 3)
    assert r.h.check_order().out_of_order == [("a2", t2, "a1")]


def test_handed_out_while_the_head_was_leased_and_its_completion_not_yet_sent() -> None:
    """Rules 1 and 3 both: a2 out while a1's lease ran, before a1's completion."""
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (t1,) = r.lease(["a1"], 3, 3.1)
    (t2,) = r.lease(["a2"], 3.2, 3.3)
    r.complete("a1", t1, ACCEPTED, 3.4, 3.5)
    r.complete("a2", t2, ACCEPTED, 3.4, 3.5)
    order = r.h.check_order()
    assert order.out_of_order == [("a2", t2, "a1")]
    assert order.two_in_flight == [("a2", t2, "a1", t1)]
    assert r.h.check_order(in_flight=False).two_in_flight is None  # clocks not comparable


def test_an_expired_head_passed_over_is_out_of_order() -> None:
    """The head's lease runs out and the next item comes out instead of it."""
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    r.lease(["a1"], 3, 3.1)  # lost
    (t2,) = r.lease(["a2"], 7, 7.1)
    r.complete("a2", t2, ACCEPTED, 7.2, 7.3)
    r.lease_and_complete(["a1"], 8)
    order = r.h.check_order()
    assert order.out_of_order == [("a2", t2, "a1")] and order.two_in_flight == []


def test_a_refused_completion_did_not_finish_the_head() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (t1,) = r.lease(["a1"], 3, 3.1)
    r.complete("a1", t1, REFUSED, 3.2, 3.3)
    (t2,) = r.lease(["a2"], 4, 4.1)
    r.complete("a2", t2, ACCEPTED, 4.2, 4.3)
    r.lease_and_complete(["a1"], 8)
    assert r.h.check_order().out_of_order == [("a2", t2, "a1")]


def test_a_later_item_then_the_head_again_is_out_of_order_even_with_dead_letters() -> None:
    """With dead letters the head may be gone at any time, unless it is leased later."""
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    (t2,) = r.lease(["a2"], 3, 3.1)
    r.complete("a2", t2, ACCEPTED, 3.2, 3.3)
    r.lease_and_complete(["a1"], 4)  # a1 was not finished at 4, so not at 3.1
    assert r.h.check_order(dead_letters=True).out_of_order == [("a2", t2, "a1")]


def test_a_reply_listing_a_group_out_of_order_is_inverted() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, 1.5)
    r.produce(["a2"], ["a"], 2, 2.5)
    r.lease_and_complete(["a2", "a1"], 3)
    order = r.h.check_order()
    assert order.inverted == [(0, "a2", "a1")] and order.out_of_order == [], order
    assert order.violations == 1


def test_an_inversion_is_caught_in_a_reply_of_two_handouts() -> None:
    r = Run()
    r.produce(["a1", "a2"], ["a", "a"], 1, 1.5)
    r.lease_and_complete(["a1", "a2", "a2", "a1"], 2)  # the second handout is inverted ...
    assert r.h.check_order().inverted == []  # ... but a1 is listed first: not provable
    r = Run()
    r.produce(["a1", "a2"], ["a", "a"], 1, 1.5)
    r.lease_and_complete(["a2", "a1", "a2"], 2)
    assert r.h.check_order().inverted == [(0, "a2", "a1")]


def test_two_handouts_of_a_group_in_flight_at_once() -> None:
    """Items with no order between them (ambiguous produces): only rule 3 can tell."""
    r = Run()
    r.produce(["a1"], ["a"], 1, unknown=True)
    r.produce(["a2"], ["a"], 1.1, unknown=True)
    (t1,) = r.lease(["a1"], 2, 2.1)
    (t2,) = r.lease(["a2"], 4, 4.1)  # a1's lease runs to 5.05
    r.complete("a1", t1, ACCEPTED, 4.5, 4.6)
    r.complete("a2", t2, ACCEPTED, 4.5, 4.6)
    order = r.h.check_order()
    assert order.two_in_flight == [("a2", t2, "a1", t1)], order
    assert order.out_of_order == [] and order.inverted == []


def test_part_of_a_handout_completed_still_holds_its_group() -> None:
    r = Run()
    r.produce(["a1", "a2"], ["a", "a"], 1, unknown=True)
    r.produce(["a3"], ["a"], 1.1, unknown=True)
    t1, t2 = r.lease(["a1", "a2"], 2, 2.1)
    r.complete("a1", t1, ACCEPTED, 2.2, 2.3)
    (t3,) = r.lease(["a3"], 2.4, 2.5)  # a2 still leased, its completion not sent
    r.complete("a2", t2, ACCEPTED, 2.6, 2.7)
    r.complete("a3", t3, ACCEPTED, 2.6, 2.7)
    assert r.h.check_order().two_in_flight == [("a3", t3, "a2", t2)]


def test_what_the_client_cannot_prove_is_not_two_in_flight() -> None:
    r = Run()
    r.produce(["a1"], ["a"], 1, unknown=True)
    r.produce(["a2"], ["a"], 1.1, unknown=True)
    r.produce(["a3"], ["a"], 1.2, unknown=True)
    (t1,) = r.lease(["a1"], 2, 2.1)
    r.complete("a1", t1, UNKNOWN, 2.2, 12.2)  # sent: it may have landed at once
    (t2,) = r.lease(["a2"], 2.3, 2.4)
    r.complete("a2", t2, ACCEPTED, 2.5, 2.6)
    r.lease_and_complete(["a3"], 2.45)  # began before a2's call returned: overlapping calls
    assert r.h.check_order().two_in_flight == []


def test_items_without_a_group_are_not_ordered() -> None:
    r = Run()
    r.produce(["n1"], [None], 1, 1.5)
    r.produce(["n2"], [None], 2, 2.5)
    r.lease_and_complete(["n2", "n1"], 3)
    order = r.h.check_order()
    assert order.violations == 0 and order.groups == {}, order
