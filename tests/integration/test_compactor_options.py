"""The compactor refuses nonsense ages, and no options can put the GC floor in the
future.

A floor in the future aborts every produce whose segment is older than the floor
("the segment fell behind the GC floor") until the clock catches up, and the
floor never goes down: ``okq-compactor --once --safety-age -600`` once stopped
all produces for ten minutes. The command refuses such ages; the library keeps
the floor at or below the compactor's now whatever its options say.
"""

from __future__ import annotations

import math

import pytest

from compactor import Compactor, CompactorOptions
from okq import ManualClock
from okq.manifests import read_manifest
from okq.store import CountingStore, Store
from tests.engines import make_engine
from tests.stores import StoreFactory

BAD_AGES = [-600.0, -1e-9, math.nan, math.inf, -math.inf]


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> Store:
    return await store_factory(request.param)


@pytest.mark.parametrize("name", ["safety_age", "lease_grace", "min_age"])
@pytest.mark.parametrize("value", BAD_AGES, ids=str)
def test_options_refuse_ages_no_pass_can_honour(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a finite number of seconds"):
        CompactorOptions(**{name: value})  # type: ignore[arg-type]


def test_options_accept_zero_ages() -> None:
    """Zero is a valid library setting (passes on a manual clock); the floor clamp
    keeps it harmless."""
    opts = CompactorOptions(safety_age=0, lease_grace=0, min_age=0)
    assert (opts.safety_age, opts.lease_grace, opts.min_age) == (0, 0, 0)


@pytest.mark.parametrize("safety_age", [-600.0, 0.0, 30.0, math.nan], ids=str)
async def test_no_options_raise_the_floor_into_the_future(
        store: Store, safety_age: float) -> None:
    """Options changed after construction skip ``__post_init__``: the pass itself
    must still keep the floor at or below now, so produces work."""
    clock = ManualClock()
    e = make_engine(store, clock)
    await e.create_queue("q")
    await e.produce("q", [b"before"])
    opts = CompactorOptions()
    opts.safety_age = safety_age
    c = Compactor(make_engine(store, clock), clock=clock, options=opts)
    await c.run_once()

    m = await read_manifest(store, "default", "q")
    assert 0 < m.gc_floor_ms <= clock.now_ms()
    await e.produce("q", [b"after"])  # not behind the floor
    clock.advance(1)
    got = await e.lease("q", 10)
    assert sorted(g.payload for g in got) == [b"after", b"before"]


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_options_refuse_a_gc_period_that_is_not_a_whole_positive_number(value: object) -> None:
    with pytest.raises(ValueError, match="gc_every must be a whole number"):
        CompactorOptions(gc_every=value)  # type: ignore[arg-type]


async def test_garbage_is_swept_every_gc_every_passes_only(store: Store) -> None:
    """Each sweep lists every queue's segments and lease objects (LISTs, billed like
    PUTs); with ``gc_every=3`` an idle queue is listed on passes 1 and 4 only."""
    counting = CountingStore(store)
    engine = await make_engine(counting, ManualClock()).start()
    await engine.create_queue("q")
    compactor = Compactor(engine, options=CompactorOptions(gc_every=3))
    lists = []
    for _ in range(4):
        before = counting.requests["list"]
        await compactor.run_once()
        lists.append(counting.requests["list"] - before)
    quiet = lists[1]
    assert lists[2] == quiet and lists[0] > quiet and lists[3] == lists[0], lists


async def test_a_pass_skips_an_empty_unchanged_queue_until_it_changes(store: Store) -> None:
    """An empty queue whose manifest did not change since a pass costs the next
    (non-sweeping) passes no GET; a produce makes the next pass look again."""
    counting = CountingStore(store)
    engine = await make_engine(counting, ManualClock()).start()
    await engine.create_queue("q")
    compactor = Compactor(engine, options=CompactorOptions(gc_every=100))
    await compactor.run_once()  # sweeping: looks
    gets = counting.requests["get"]
    await compactor.run_once()
    await compactor.run_once()
    assert counting.requests["get"] == gets, "quiet passes read nothing"
    await engine.produce("q", [b"x"])
    gets = counting.requests["get"]
    await compactor.run_once()
    assert counting.requests["get"] > gets, "a changed manifest is read"
