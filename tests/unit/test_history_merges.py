"""The client-history checker (tests/history.py) knows an item by its idempotency key:
a compactor merge gives the items it carries new ids (docs/DESIGN.md "Known limits"),
so an item acknowledged as one id may be delivered and completed as another. That is
neither a loss nor a duplicate; a key completed as two ids, or acknowledged as two, is
a duplicate, and a delivery under any id after the item's completion is late."""

from __future__ import annotations

import itertools

from tests.history import ACCEPTED, REFUSED, History


def _history() -> History:
    ticks = itertools.count()
    return History(clock=lambda: float(next(ticks)))


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
