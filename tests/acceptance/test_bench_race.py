"""The race benchmark runs: ``benchmarks/bench_race.py --quick`` on okq's file store,
and on Redis streams too when ``redis-server`` and the ``redis`` client are installed
(the benchmark's ``bench`` extra; CI installs only ``test``), as a subprocess.

It must exit 0, print its one table with a row of figures per system, the ratios when
there is a peer, the command and the date, and find every message leased exactly
once. Timings are printed, never asserted: the figures only have to be figures.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "benchmarks" / "bench_race.py"
HEADER = "| system | produce msg/s | lease+complete msg/s |"


def redis_missing() -> str | None:
    """Why Redis cannot race here, or None when it can."""
    if shutil.which("redis-server") is None:
        return "no redis-server on PATH"
    if importlib.util.find_spec("redis") is None:
        return "the redis client library is not installed (pip install -e '.[bench]')"
    return None


SYSTEMS = ["okq-file"] + ([] if redis_missing() else ["redis"])


@pytest.fixture(scope="module")
def race() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--systems", ",".join(SYSTEMS)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )


def main_table(stdout: str) -> dict[str, list[str]]:
    """The race table's rows by system: the cells after the system's name."""
    lines = stdout.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(HEADER))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", "").replace("$", ""))


def assert_figures(cells: list[str]) -> None:
    """produce, lease+complete, p50 / p99, CPU produce / consume, RSS: all numbers."""
    produce, consume, latency, cpu, rss = cells[:5]
    assert number(produce) > 0 and number(consume) > 0, cells
    p50, p99 = (number(v) for v in latency.split(" / "))
    assert 0 <= p50 <= p99, cells
    assert all(number(v) >= 0 for v in cpu.split(" (")[0].split(" / ")), cells
    assert number(rss.split(" ")[0]) > 0, cells
    assert cells[-1] == "0 / 0", cells  # lost / duplicated


def test_exits_0_and_finds_nothing_lost_or_duplicated(
        race: subprocess.CompletedProcess[str]) -> None:
    assert race.returncode == 0, race.stdout[-3000:] + race.stderr[-3000:]
    assert "checked: 0 lost, 0 duplicated" in race.stdout, race.stdout[-3000:]


def test_prints_the_command_and_the_date(race: subprocess.CompletedProcess[str]) -> None:
    assert re.search(r"^# okq race, \d{4}-\d\d-\d\d \d\d:\d\d UTC$", race.stdout, re.M)
    assert re.search(r"^command: \S*python\S* \S*bench_race\.py --quick --systems "
                     + re.escape(",".join(SYSTEMS)) + "$", race.stdout, re.M), race.stdout[:500]


def test_okq_file_row(race: subprocess.CompletedProcess[str]) -> None:
    cells = main_table(race.stdout)["okq file store"]
    assert_figures(cells)
    requests = [number(v) for v in cells[5].split(" / ")]  # GET / PUT / LIST / HEAD / DELETE
    assert requests[1] > 0, cells  # a produce writes at least one object
    assert number(cells[6]) > 0  # $ per million messages


def test_redis_row_and_ratios(race: subprocess.CompletedProcess[str]) -> None:
    reason = redis_missing()
    if reason:
        pytest.skip(reason)
    cells = main_table(race.stdout)["Redis streams"]
    assert_figures(cells)
    assert cells[5] == cells[6] == "n/a"  # no object store
    # Redis runs with its defaults (the terms), and the output says what they keep.
    assert "persistence snapshots only" in race.stdout and "appendonly no" in race.stdout
    ratio = re.search(r"^\| okq file store \| Redis streams \|(.*)\|$", race.stdout, re.M)
    assert ratio is not None, race.stdout[-3000:]
    assert all(re.fullmatch(r"\d+\.\d\dx", c.strip()) for c in ratio.group(1).split("|"))
