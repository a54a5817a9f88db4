"""The fleet simulation (benchmarks/fleet_sim.py, benchmarks/fleetsim/): properties
the model must keep whatever its calibration. Small fleets, a fraction of a
simulated second each: the whole file runs in about a second."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fleetsim.calibration import Calibration
from fleetsim.store import PROFILES, Profile
from fleetsim.workload import Phase, Setup, World

CAL = Calibration()
SECONDS = 0.6


def produce(setup: Setup) -> Phase:
    return World(setup, CAL).produce_phase(seconds=SECONDS)


def drain(setup: Setup) -> Phase:
    return World(setup, CAL).drain_phase(seconds=SECONDS)


def fleet(store: str, nodes: int, partitions: int, profile: Profile | None = None) -> Setup:
    clients = 16 * partitions
    return Setup(store=store, nodes=nodes, partitions=partitions, shards=partitions,
                 producers=clients, consumers=clients, profile=profile)


@pytest.mark.parametrize("run", [produce, drain])
def test_one_partition_does_not_grow_with_nodes(run: Callable[[Setup], Phase]) -> None:
    """One manifest has one holder: nodes added only forward to it."""
    one = run(fleet("minio", 1, 1)).rate
    four = run(fleet("minio", 4, 1)).rate
    assert four <= one * 1.05, (one, four)


@pytest.mark.parametrize("run", [produce, drain])
def test_partitions_over_as_many_nodes_scale_linearly(run: Callable[[Setup], Phase]) -> None:
    """Without a store limit, twice the nodes and partitions do about twice the
    work. A node forwards the calls of partitions it does not hold, (N - 1) / N
    of them, so a node does a little less as N grows: from 8 to 16 nodes the
    share forwarded goes from 7/8 to 15/16."""
    eight = run(fleet("minio", 8, 8)).rate
    sixteen = run(fleet("minio", 16, 16)).rate
    assert 1.85 <= sixteen / eight <= 2.15, (eight, sixteen)


def test_a_prefix_limit_caps_the_write_rate() -> None:
    """Past a prefix's PUT limit, requests are refused and retried: the fleet's
    PUT rate stays at the limit, and throughput falls below the unlimited fleet's."""
    limited = replace(PROFILES["minio"], prefix_put=150.0)
    free = drain(fleet("minio", 4, 4))
    capped = drain(fleet("minio", 4, 4, profile=limited))
    assert capped.requests["throttled"] > 0
    assert capped.requests["put"] / capped.seconds <= 150.0 * 1.1
    assert free.requests["put"] / free.seconds > 300.0
    assert capped.rate < free.rate / 2


def test_requests_per_message_match_the_design() -> None:
    """docs/DESIGN.md, "Request cost", at batch 100 with 4 producers and 4
    consumers: produce is 2 PUTs per group commit of the 4 calls (0.005 a
    message); a lease batch and a completion batch are one lease-object PUT each,
    completions sharing a write now and then: between 0.013 a message (the engine
    alone, DESIGN.md's 0.018 end to end) and 0.020 (none shared), 0.0225 end to end
    through a node (docs/PERFORMANCE.md, "Requests per message"); one GET per
    segment (its lease object, read once)."""
    world = World(Setup(store="minio", nodes=2), CAL)
    made = world.produce_phase(messages=20_000)
    done = world.drain_phase()
    assert made.per_message("put") == pytest.approx(0.005, abs=0.0005)
    assert 0.013 <= done.per_message("put") <= 0.020, done.per_message("put")
    end_to_end = made.per_message("put") + done.per_message("put")
    assert end_to_end == pytest.approx(0.0225, abs=0.002)
    assert done.per_message("get") == pytest.approx(0.0025, abs=0.0005)


def test_gcs_one_write_per_object_a_second_bounds_a_partition() -> None:
    """A manifest written at most once a second: a partition publishes at most
    1,000 items (one group commit) a second on GCS."""
    rate = produce(fleet("gcs", 1, 1)).rate
    assert rate <= 1000 * 1.2, rate


def mixed(setup: Setup) -> Phase:
    return World(setup, CAL).mixed_phase(800.0, SECONDS)


@pytest.mark.parametrize("run", [drain, mixed])
def test_a_seed_gives_the_same_result_twice(run: Callable[[Setup], Phase]) -> None:
    """Everything random comes from the seed, and long polls (16 on one partition
    in the mixed phase) wake in the order they began waiting, not in a set's."""
    setup = fleet("s3", 2, 1)
    first, second = run(setup), run(setup)
    assert (first.messages, first.seconds, first.requests, first.latencies) == \
        (second.messages, second.seconds, second.requests, second.latencies)
    other = run(replace(setup, seed=2))
    assert (other.seconds, other.requests) != (first.seconds, first.requests)
