"""bench_client_cpu.py's counted workloads, run briefly without valgrind: the real
client against the benchmark's stand-in session, whose replies the node's own
encoders make. The benchmark runs them under callgrind only, so a change of the
node's interfaces would break it unseen (the lease reply's encoder moved to
okq.server.codec once, and the benchmark failed for a day)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_client_cpu.py"


@pytest.fixture(scope="module")
def bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_client_cpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_client_cpu"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", ["produce", "lease+complete", "lease+read+complete", "worker"])
def test_each_counted_workload_runs(bench: object, kind: str) -> None:
    asyncio.run(bench.fake_workload(kind, 300))  # type: ignore[attr-defined]


def test_the_stand_in_lease_reply_is_what_the_client_reads(bench: object) -> None:
    from okq.client import _leased_items

    items = _leased_items(bench.Replies().lease(3))  # type: ignore[attr-defined]
    assert [i.id for i in items] == [f"{n:026d}" for n in range(3)]
    assert all(i.bytes == bench.PAYLOAD for i in items)  # type: ignore[attr-defined]
