"""The client-history checker (tests/history.py) finds each kind of fault in a
hand-written history and reports a clean one as clean."""

from __future__ import annotations

import itertools

import pytest

from tests.history import ACCEPTED, REFUSED, UNKNOWN, History


def _history() -> History:
    """A history whose clock ticks by one at every reading: events are ordered."""
    ticks = itertools.count()
    return History(clock=lambda: float(next(ticks)))


def _clean(h: History) -> None:
    """Three items produced, delivered, completed; one redelivered after a lost lease."""
    h.produced(["k1", "k2"], ["a", "b"])
    h.produce_failed(["k3"], unknown=True)  # a 502: did it land?
    h.produced(["k3"], ["c"])  # the retry with the same key says it did
    for item_id, key in (("a", "k1"), ("b", "k2"), ("c", "k3")):
        h.delivered(item_id, f"{item_id}-t1", 1, key=key)
    h.completed("a", "a-t1", ACCEPTED)
    h.completed("a", "a-t1", ACCEPTED)  # a retried completion of the same delivery
    h.completed("b", "b-t1", ACCEPTED)
    h.completed("c", "c-t1", REFUSED)  # the lease expired first
    h.delivered("c", "c-t2", 2, key="k3")
    h.completed("c", "c-t2", ACCEPTED)


def test_a_clean_history_reports_zeros() -> None:
    h = _history()
    _clean(h)
    report = h.check()
    assert report.ok, report.summary()
    assert (report.produced, report.lost, report.uncertain, report.completed_twice) == \
        (3, [], [], [])
    assert (report.late_deliveries, report.unexpected, report.duplicated_keys) == ([], [], [])
    assert (report.deliveries, report.items_delivered, report.refused_completions) == (4, 3, 1)
    assert report.duplicate_delivery_rate == pytest.approx(1 / 3)
    assert (report.retried_unknown, report.unconfirmed_produces) == (1, 0)
    assert h.outstanding() == set()


def test_an_acknowledged_item_never_completed_is_lost() -> None:
    h = _history()
    _clean(h)
    h.produced(["k4"], ["d"])
    h.delivered("d", "d-t1", 1, key="k4")
    h.completed("d", "d-t1", REFUSED)
    report = h.check()
    assert report.lost == ["d"] and not report.ok
    assert h.outstanding() == {"d"}


def test_a_completion_of_unknown_outcome_is_uncertain_not_lost() -> None:
    h = _history()
    _clean(h)
    h.produced(["k4"], ["d"])
    h.delivered("d", "d-t1", 1, key="k4")
    h.completed("d", "d-t1", UNKNOWN)
    report = h.check()
    assert (report.lost, report.uncertain) == ([], ["d"])
    assert report.ok


def test_two_deliveries_both_accepted_are_completed_twice() -> None:
    h = _history()
    _clean(h)
    h.delivered("b", "b-t2", 2, key="k2", invoked=-1.0)  # leased before the first completion
    h.completed("b", "b-t2", ACCEPTED)
    report = h.check()
    assert report.completed_twice == ["b"] and not report.ok
    assert report.late_deliveries == []


def test_a_delivery_begun_after_an_accepted_completion_is_late() -> None:
    h = _history()
    _clean(h)
    h.delivered("a", "a-t2", 2, key="k1")
    h.completed("a", "a-t2", REFUSED)
    report = h.check()
    assert report.late_deliveries == [("a", "a-t2")] and not report.ok
    assert report.completed_twice == []


def test_an_item_nobody_produced_is_unexpected() -> None:
    h = _history()
    _clean(h)
    h.produce_failed(["k9"], unknown=False)  # refused for sure: nothing may appear
    h.delivered("x", "x-t1", 1, key="k9")
    h.delivered("y", "y-t1", 1, key=None)
    h.completed("x", "x-t1", ACCEPTED)
    assert h.check().unexpected == ["x", "y"]


def test_an_unknown_produce_that_shows_up_later_is_expected() -> None:
    h = _history()
    _clean(h)
    h.produce_failed(["k5"], unknown=True)
    h.delivered("e", "e-t1", 1, key="k5")
    h.completed("e", "e-t1", ACCEPTED)
    report = h.check()
    assert report.ok, report.summary()
    assert (report.unexpected, report.unconfirmed_produces) == ([], 1)


def test_one_key_that_became_two_items_is_reported() -> None:
    h = _history()
    _clean(h)
    h.delivered("c2", "c2-t1", 1, key="k3")  # the retried produce made a second item
    h.completed("c2", "c2-t1", ACCEPTED)
    assert h.check().duplicated_keys == ["k3"]


def test_mismatched_acknowledgement_is_refused() -> None:
    with pytest.raises(ValueError, match="2 keys but 1 ids"):
        _history().produced(["k1", "k2"], ["a"])
    with pytest.raises(ValueError, match="outcome"):
        _history().completed("a", "t", "maybe")


def test_a_lease_given_while_another_runs_is_an_early_redelivery() -> None:
    h = _history()
    h.produced(["k1", "k2"], ["a", "b"])
    h.delivered("a", "a-t1", 1, key="k1", deadline=100.0)
    h.delivered("a", "a-t2", 2, key="k1", deadline=101.0)  # leased at 99, before 100
    h.delivered("b", "b-t1", 1, key="k2", deadline=100.0)
    h.delivered("b", "b-t2", 2, key="k2", deadline=102.5)  # leased at 100.5, after it ended
    h.completed("a", "a-t2", ACCEPTED)
    h.completed("b", "b-t2", ACCEPTED)
    assert h.check().early_redeliveries == []  # not asked for: renewals would confuse it
    report = h.check(lease_timeout=2.0)
    assert report.early_redeliveries == [("a", "a-t2")] and not report.ok

# -- items a compactor merge renamed -----------------------------------------------------
# The checker knows an item by its idempotency key: a merge gives the items it carries
# new ids (docs/DESIGN.md "Known limits"), so an item acknowledged as one id may be
# delivered and completed as another. That is neither a loss nor a duplicate; a key
# completed as two ids, or acknowledged as two, is a duplicate, and a delivery under
# any id after the item's completion is late.


def _merged(h: History) -> None:
    """k1 acknowledged as a, leased as a (lost), merged into m.0, leased and completed."""
    h.produced(["k1", "k2"], ["a", "b"])
    h.delivered("a", "a-t1", 1, key="k1")
    h.delivered("b", "b-t1", 1, key="k2")
    h.completed("b", "b-t1", ACCEPTED)
    h.delivered("m.0", "m-t1", 2, key="k1")
    h.completed("a", "a-t1", REFUSED)  # the first lease ran out long ago
    h.completed("m.0", "m-t1", ACCEPTED)


def test_an_item_merged_under_a_new_id_is_neither_lost_nor_duplicated() -> None:
    h = _history()
    _merged(h)
    report = h.check()
    assert report.ok, report.summary()
    assert (report.lost, report.uncertain, report.duplicated_keys) == ([], [], [])
    assert (report.deliveries, report.items_delivered) == (3, 2)
    assert h.outstanding() == set()  # a drain does not wait for the old id


def test_before_its_merged_copy_is_completed_the_item_is_outstanding() -> None:
    h = _history()
    h.produced(["k1"], ["a"])
    h.delivered("m.0", "m-t1", 2, key="k1")
    assert h.outstanding() == {"a"}
    report = h.check()
    assert report.lost == ["a"]


def test_a_key_completed_as_two_ids_is_duplicated() -> None:
    h = _history()
    _merged(h)
    h.delivered("c", "c-t1", 1, key="k2", invoked=-1.0)  # a second item of k2
    h.completed("c", "c-t1", ACCEPTED)
    report = h.check()
    assert report.duplicated_keys == ["k2"] and not report.ok


def test_a_key_acknowledged_as_two_ids_is_duplicated_and_each_must_be_completed() -> None:
    h = _history()
    h.produced(["k1"], ["a"])
    h.produced(["k1"], ["b"])  # the retry made a second item
    h.delivered("a", "a-t1", 1, key="k1")
    h.completed("a", "a-t1", ACCEPTED)
    report = h.check()
    assert report.duplicated_keys == ["k1"]
    assert report.lost == []  # both ids stand for k1, which was completed


def test_a_delivery_under_a_new_id_after_the_completion_is_late() -> None:
    h = _history()
    _merged(h)
    h.delivered("m2.0", "m2-t1", 3, key="k1")  # after m.0's completion was accepted
    h.completed("m2.0", "m2-t1", REFUSED)
    report = h.check()
    assert report.late_deliveries == [("m2.0", "m2-t1")] and not report.ok
