"""The SQS-against-native benchmark runs: ``benchmarks/bench_sqs.py --quick`` as a
subprocess on the file store.

It must exit 0, print its table with a row of figures for each API, the SQS / native
ratios and which clients drove the node, and find every message received once. Timings
are printed, never asserted: the figures only have to be figures. The benchmark's own
check (what makes it exit 1) is tried on made-up counts as well, so that a benchmark
that could never find a loss cannot pass here.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "benchmarks" / "bench_sqs.py"
HEADER = ("| api | produce msg/s | receive+delete msg/s | CPU us/msg produce | "
          "CPU us/msg consume |")


@pytest.fixture(scope="module")
def quick() -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def table(stdout: str) -> dict[str, list[float]]:
    """The table's rows by API: the four figures after the API's name."""
    lines = stdout.splitlines()
    start = lines.index(HEADER)
    rows: dict[str, list[float]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = [float(c.replace(",", "")) for c in cells[1:]]
    return rows


def test_exits_0_and_finds_nothing_lost_or_duplicated(
        quick: subprocess.CompletedProcess[str]) -> None:
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    assert re.search(r"^checked: 0 lost, 0 duplicated, 0 deletions refused \(2 runs and 2 "
                     r"warm-ups, 880 messages\)$", quick.stdout, re.M), quick.stdout[-3000:]


def test_prints_the_table_and_the_ratios(quick: subprocess.CompletedProcess[str]) -> None:
    assert HEADER in quick.stdout, quick.stdout[-3000:] + quick.stderr[-3000:]
    rows = table(quick.stdout)
    assert set(rows) == {"native", "SQS"}, rows
    for figures in rows.values():
        produce_rate, consume_rate, produce_cpu, consume_cpu = figures
        assert produce_rate > 0 and consume_rate > 0
        assert produce_cpu >= 0 and consume_cpu >= 0
    assert re.search(r"^SQS / native: produce msg/s \d+\.\d\dx, receive\+delete msg/s "
                     r"\d+\.\d\dx, CPU us/msg produce \d+\.\d\dx, consume \d+\.\d\dx$",
                     quick.stdout, re.M), quick.stdout[-3000:]


def test_says_which_clients_drove_the_node(quick: subprocess.CompletedProcess[str]) -> None:
    assert re.search(r"^- SQS: aiobotocore \S+ .*json protocol", quick.stdout, re.M)
    assert re.search(r"^- native: okq\.client\.Client \(msgpack", quick.stdout, re.M)
    assert re.search(r"^command: \S*python\S* \S*bench_sqs\.py --quick$", quick.stdout, re.M)


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sqs", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_check_finds_losses_and_duplicates() -> None:
    check_type = bench_module().Check
    whole = check_type(3, Counter({0: 1, 1: 1, 2: 1}))
    assert whole.ok() and whole.lost() == whole.duplicated() == 0
    lost = check_type(3, Counter({0: 1, 2: 1}))
    assert not lost.ok() and lost.lost() == 1
    twice = check_type(3, Counter({0: 1, 1: 2, 2: 1}))
    assert not twice.ok() and twice.duplicated() == 1
    late = check_type(3, Counter({0: 1, 1: 1, 2: 1}), late=1)
    assert not late.ok() and late.duplicated() == 1
    refused = check_type(3, Counter({0: 1, 1: 1, 2: 1}), undeleted=2)
    assert not refused.ok()
