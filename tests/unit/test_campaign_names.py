"""The fault campaign's scenario names (tests/campaign.py ``scenario_spec``), and how
its report shows an ordered queue's scenario (``+fifo``) and fails on its order."""

from __future__ import annotations

import pytest

from tests.campaign import (
    LONG,
    SHORT,
    Load,
    Run,
    Spec,
    _parse,
    markdown,
    outcome_of,
    scenario_parts,
    scenario_spec,
)
from tests.history import ACCEPTED


@pytest.mark.parametrize(("name", "spec"), [
    ("kill", Spec("kill")),
    ("kill:2", Spec("kill", 2)),
    ("kill+fifo", Spec("kill", fifo=True)),
    ("kill:2+fifo", Spec("kill", 2, fifo=True)),
    ("clock@direct", Spec("clock", direct=True)),
    ("clock:3+fifo@direct", Spec("clock", 3, fifo=True, direct=True)),
    ("clock-beyond+fifo@direct", Spec("clock-beyond", fifo=True, direct=True)),
])
def test_a_scenario_name_says_injector_partitions_order_and_fleet(name: str,
                                                                   spec: Spec) -> None:
    assert scenario_spec(name) == spec
    assert scenario_parts(name) == (spec.injector, spec.partitions)


@pytest.mark.parametrize("name", ["nope", "kill+lifo", "kill:0", "kill:x", "kill:", "kill+",
                                  "kill@elsewhere", "kill@direct+fifo", "kill+fifo:2"])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a scenario"):
        scenario_spec(name)
    with pytest.raises(SystemExit):
        _parse(["--scenarios", f"store,{name}"])


def test_the_profiles_run_ordered_scenarios() -> None:
    """The short form kills nodes under an ordered queue of partitions (in the place of
    a standard queue's: it takes no longer); the long form runs several scenarios on
    ordered queues, on both fleets."""
    assert [n for n in SHORT.scenarios if scenario_spec(n).fifo] == ["kill:2+fifo"]
    assert len(SHORT.scenarios) == 5
    fifo = {n for n in LONG.scenarios if scenario_spec(n).fifo}
    assert {"store+fifo", "kill+fifo", "stop+fifo", "s3-restart+fifo", "kill:2+fifo",
            "clock+fifo@direct"} <= fifo
    assert _parse(["--scenarios", "kill:2+fifo,clock+fifo@direct"]).names == \
        ["kill:2+fifo", "clock+fifo@direct"]


def _outcome(name: str, out_of_order: bool) -> str:
    load = Load("q", [], [])
    h = load.history
    h.sending(["a1"], ["g0"])
    h.produced(["a1"], ["a1"])
    h.sending(["a2"], ["g0"])
    h.produced(["a2"], ["a2"])
    for key in (["a2", "a1"] if out_of_order else ["a1", "a2"]):
        call = h.new_call()
        h.delivered(key, f"{key}-t", 1, key=key, call=call)
        h.completed(key, f"{key}-t", ACCEPTED, sent=h.clock())
    outcome = outcome_of(name, "sequencer", 1.0, True, load, h.check(), Run(load),
                         h.check_order())
    assert outcome.order_violations == int(out_of_order)
    assert outcome.groups == {"g0": 2} and outcome.split_groups == 0
    return markdown([outcome], {"profile": "short", "seed": 1, "started": "now", "seconds": 1,
                                "fleet_start": [1.0], "fleet": "test"}) + \
        f"failed={outcome.failed}"


def test_the_report_shows_order_and_fails_on_it() -> None:
    clean = _outcome("kill:2+fifo", out_of_order=False)
    assert "| 0 | 0 (0.000) |" in clean and "out of order 0" in clean
    assert clean.endswith("failed=False")
    broken = _outcome("kill:2+fifo", out_of_order=True)
    assert "out of order 1" in broken and broken.endswith("failed=True")
    # past the clock bound order is not promised: reported, not failed
    beyond = _outcome("clock-beyond+fifo@direct", out_of_order=True)
    assert "order is not promised" in beyond and beyond.endswith("failed=False")


def test_a_standard_queue_scenario_shows_no_order() -> None:
    load = Load("q", [], [])
    outcome = outcome_of("kill", "sequencer", 1.0, True, load, load.history.check(),
                         Run(load))
    assert outcome.order_violations is None and not outcome.failed
    assert "| n/a |" in markdown([outcome], {"profile": "short", "seed": 1, "started": "now",
                                             "seconds": 1, "fleet_start": [1.0],
                                             "fleet": "test"})


def test_items_out_of_order_behind_a_lost_item_are_counted_apart() -> None:
    """A group going on past an item that never came out: the loss may be the cause."""
    load = Load("q", [], [])
    h = load.history
    for key in ("a1", "a2"):
        h.sending([key], ["g0"])
        h.produced([key], [key])
    h.delivered("a2", "a2-t", 1, key="a2", call=h.new_call())
    h.completed("a2", "a2-t", ACCEPTED, sent=h.clock())
    report = h.check()
    outcome = outcome_of("kill:2+fifo", "sequencer", 1.0, True, load, report, Run(load),
                         h.check_order())
    assert (outcome.lost, outcome.out_of_order, outcome.out_of_order_behind_lost) == (1, 1, 1)
