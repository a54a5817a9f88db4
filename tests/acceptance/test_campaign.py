"""The fault campaign's short form (tests/campaign.py) as CI runs it.

``python -m tests.campaign --short`` runs as a subprocess against a real fleet
(SeaweedFS behind the fault proxy, three nodes, the compactor, nginx); these tests
read the JSON report it writes and check that every scenario lost nothing,
completed nothing twice and delivered nothing after its completion, and that each
actually injected its faults; a scenario on an ordered queue (``+fifo``) must
also show no order violation (none out of order, none inverted within a handout,
no two handouts of a group in flight, no group in two partitions), having
delivered items of most of its groups, each against earlier items of its group.
The short form's scenarios on the sequencer-mode fleet run here; those on the
fleet without the sequencer (``name@direct``) run in test_campaign_direct.py, so
that the suite's workers run the two fleets side by side (``--scenarios`` picks
each half; together they are ``SHORT.scenarios``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from okq.dev.servers import ServerMissing
from tests.campaign import FIFO_GROUPS, SHORT, require_programs, scenario_parts, scenario_spec

pytestmark = pytest.mark.s3
SEED = 13


def _faults(scenario: dict[str, Any], prefix: str) -> int:
    return sum(n for kind, n in scenario["faults"].items() if kind.startswith(prefix))


def _check_store(s: dict[str, Any]) -> None:
    assert _faults(s, "500") > 0 and _faults(s, "slow") > 0, s["faults"]
    assert _faults(s, "timeout") > 0, s["faults"]
    assert s["faults"]["500 (landed)"] + s["faults"]["dropped connection (landed)"] > 0


def _check_kill(s: dict[str, Any]) -> None:
    assert s["faults"]["SIGKILL node"] > 0 and s["faults"]["SIGKILL compactor"] > 0


def _check_stop(s: dict[str, Any]) -> None:
    assert s["faults"]["SIGSTOP node"] > 0
    # the stopped node's consumers completed after SIGCONT, too late: refused
    assert s["faults"]["late completions refused"] > 0
    assert s["operations"]["completions refused"] > 0


def _check_clock(s: dict[str, Any]) -> None:
    assert _faults(s, "node ") >= 3 and _faults(s, "compactor clock") == 1, s["faults"]
    for node, clock in s["clocks"].items():  # libfaketime took: the node's Date header
        assert clock["seen"] is not None and abs(clock["seen"] - clock["asked"]) < 3, node


def _check_s3_restart(s: dict[str, Any]) -> None:
    assert s["faults"]["SeaweedFS restarts"] > 0


CHECKS = {"store": _check_store, "kill": _check_kill, "stop": _check_stop,
          "clock": _check_clock, "s3-restart": _check_s3_restart}


def _check_order(s: dict[str, Any]) -> None:
    """An ordered queue's scenario: no order violation, and order actually exercised."""
    assert (s["order_violations"], s["out_of_order"], s["inverted_in_handout"],
            s["split_groups"]) == (0, 0, 0, 0), (s["scenario"], s["order"], s["examples"])
    skewed = scenario_parts(s["scenario"])[0].startswith("clock")
    assert s["two_in_flight"] == (None if skewed else 0), s["order"]
    delivered = {g: n for g, n in s["groups"].items() if n > 0}
    assert len(delivered) >= FIFO_GROUPS // 2 and min(delivered.values()) >= 10, s["groups"]
    assert s["order_checked"] > sum(delivered.values()) // 2, s["order"]


#: The short form's scenarios on the sequencer-mode fleet, and those on the other one.
SEQUENCER = [n for n in SHORT.scenarios if not scenario_spec(n).direct]
DIRECT = [n for n in SHORT.scenarios if scenario_spec(n).direct]


@pytest.mark.timeout(600)
def test_short_campaign_loses_nothing_and_completes_nothing_twice(tmp_path: Path) -> None:
    run_short_campaign(tmp_path, SEQUENCER)


def run_short_campaign(tmp_path: Path, names: list[str]) -> None:
    """``python -m tests.campaign --short --scenarios names``, and its report checked."""
    assert names and set(names) <= set(SHORT.scenarios)
    try:
        require_programs()
    except ServerMissing as exc:
        pytest.skip(str(exc))
    report = tmp_path / "campaign.md"
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.campaign", "--short", "--seed", str(SEED),
         "--scenarios", ",".join(names),
         "--report", str(report), "--dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=540, check=False)
    took = time.monotonic() - began
    print(f"\ncampaign --short took {took:.0f} s\n{proc.stdout}")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    result = json.loads(report.with_suffix(".json").read_text())
    scenarios = {s["scenario"]: s for s in result["scenarios"]}
    assert sorted(scenarios) == sorted(names)
    for name, s in scenarios.items():
        assert s["drained"], name
        assert (s["lost"], s["completed_twice"], s["delivered_after_completion"]) == \
            (0, 0, 0), (name, s["checker"])
        assert s["operations"]["produce acknowledged"] > 0, name
        assert s["operations"]["completions accepted"] > 0, name
        CHECKS[scenario_parts(name)[0]](s)
        if scenario_spec(name).fifo:
            _check_order(s)
        else:
            assert s["order_violations"] is None, name
