"""Ambiguous writes overwritten before the re-read, on SeaweedFS with real processes
(issue 8, defects 1 and 2).

Two ``okq serve`` nodes share one store prefix, each behind its own
fault-injecting proxy (tests/s3proxy.py). The proxy lets one of node A's
writes land, holds the reply while node B (or a compactor process) writes the
same object, then answers A with a 500. A re-reads, finds another writer's
nonce, and must still neither publish a segment twice nor lose what it leased.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from okq.client import Client
from okq.errors import LeaseLost
from okq.wire import LeasedItemOut
from tests.nodes import Node, okq_node
from tests.s3proxy import Rule, S3Proxy
from tests.servers import BUCKET

pytestmark = pytest.mark.s3

Q = "amb"
MANIFEST_PUT = rf"/default/manifests/{Q}$"
LEASE_PUT = rf"/default/leases/{Q}/"


@dataclass
class Fleet:
    store: str
    seaweed: str  # SeaweedFS itself, for the compactor: no faults on its way
    a: Node
    b: Node
    proxy_a: S3Proxy

    def held_reply(self, path: str) -> Rule:
        """Node A's next PUT to ``path`` lands; its reply waits for release(), then 500."""
        return self.proxy_a.add(Rule(method="PUT", path=path, hold=True, reply="error"))


@pytest.fixture
def fleet(seaweed_endpoint: str, tmp_path: Path) -> Iterator[Fleet]:
    store = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(S3Proxy(seaweed_endpoint)) for _ in range(2)]
        a, b = (stack.enter_context(okq_node(store, tmp_path, endpoint_url=p.endpoint))
                for p in proxies)
        for proxy in proxies:  # a failed test's held reply must not delay the nodes' stop
            stack.callback(proxy.clear)
        yield Fleet(store, seaweed_endpoint, a, b, proxies[0])


def compact(fleet: Fleet, endpoint: str | None = None) -> None:
    """One ``okq-compactor --once`` pass (default options), straight to SeaweedFS
    unless ``endpoint`` names a proxy."""
    proc = subprocess.run(
        [sys.executable, "-m", "compactor", "--store", fleet.store,
         "--endpoint-url", endpoint or fleet.seaweed, "--once", "--log-level", "INFO"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


async def drain(clients: list[Client], expected: int) -> list[LeasedItemOut]:
    """Lease through every node until ``expected`` items came, then once more:
    anything beyond what was produced is a second copy."""
    got: list[LeasedItemOut] = []
    give_up = time.monotonic() + 15
    while len(got) < expected and time.monotonic() < give_up:
        for c in clients:
            got += await c.lease(Q, 100, request_timeout=0.5)
    for c in clients:
        got += await c.lease(Q, 100, request_timeout=0.5)
    return got


async def complete_all(clients: list[Client], items: list[LeasedItemOut]) -> int:
    """Complete each delivery on its own, alternating nodes; how many were accepted."""
    done = 0
    for n, item in enumerate(items):
        done += await clients[n % len(clients)].complete(Q, [item.token])
    return done


@pytest.mark.parametrize("other", ["node", "compactor"])
async def test_ambiguous_produce_overwritten_is_published_once(fleet: Fleet, other: str) -> None:
    """Defect 1: A's manifest CAS lands, another writer's CAS lands on top before
    A learns anything; A must not publish its segment again, whether the other
    writer is a node's produce (the segment is still listed) or a compactor pass
    (which today merges it away)."""
    async with Client(fleet.a.url, timeout=30) as ca, Client(fleet.b.url, timeout=30) as cb:
        await ca.create_queue(Q)
        first = [f"first-{n}" for n in range(3)]
        await ca.produce(Q, first)  # an earlier segment: a compactor has a group to merge
        rule = fleet.held_reply(MANIFEST_PUT)
        held = [f"held-{n}" for n in range(4)]
        producing = asyncio.create_task(ca.produce(Q, held))
        await rule.until_held()  # A's publish has landed; A has not heard back
        late: list[str] = []
        if other == "node":
            late = [f"late-{n}" for n in range(2)]
            await cb.produce(Q, late)
        else:
            # Whether the pass may merge A's just-published segment away is the
            # compactor's policy (today's merges it); either way its commit writes
            # the manifest on top of A's write (at least to raise the GC floor).
            with S3Proxy(fleet.seaweed) as spy:
                writes = spy.add(Rule(method="PUT", path=MANIFEST_PUT, times=None))
                await asyncio.to_thread(compact, fleet, spy.endpoint)
            assert writes.matched, "the compactor pass did not write the manifest"
        rule.release()
        ids = await asyncio.wait_for(producing, 30)
        everything = [*first, *held, *late]
        info = await cb.queue_info(Q)
        listed = await cb.stats(Q)
        await asyncio.to_thread(compact, fleet)  # copies whatever the manifest lists
        delivered = await drain([ca, cb], len(everything))
        accepted = await complete_all([ca, cb], delivered)
        after = await cb.stats(Q)

    assert len(ids) == len(held) and len(rule.matched) == 1
    assert {
        "produced": info.produced,
        "available": listed.available,
        "deliveries": dict(sorted(Counter(i.utf8 for i in delivered).items())),
        "completions accepted": accepted,
        "completed, in flight, available": (after.completed, after.in_flight, after.available),
    } == {
        "produced": len(everything),
        "available": len(everything),
        "deliveries": dict.fromkeys(sorted(everything), 1),
        "completions accepted": len(everything),
        "completed, in flight, available": (len(everything), 0, 0),
    }


async def test_ambiguous_lease_overwritten_returns_the_leased_item(fleet: Fleet) -> None:
    """Defect 2: A's lease CAS lands, B leases another item of the same segment
    (same lease object) before A re-reads; A must answer with the item it
    leased and a token that completes, not strand it until its deadline."""
    async with Client(fleet.a.url, timeout=30) as ca, Client(fleet.b.url, timeout=30) as cb:
        await ca.create_queue(Q)
        ids = await ca.produce(Q, ["one", "two"])  # one segment, one lease object
        rule = fleet.held_reply(LEASE_PUT)
        leasing = asyncio.create_task(ca.lease(Q, 1))
        await rule.until_held()  # A has leased "one"; A has not heard back
        on_b = await cb.lease(Q, 1)  # B's write lands on top of A's
        rule.release()
        on_a = await asyncio.wait_for(leasing, 30)
        accepted = await complete_all([ca], on_a) + await complete_all([cb], on_b)
        stats = await cb.stats(Q)

    assert [i.id for i in on_b] == [ids[1]] and len(rule.matched) == 1
    assert {
        "leased on A": [(i.id, i.utf8, i.attempts) for i in on_a],
        "completions accepted": accepted,
        "completed, in flight, available": (stats.completed, stats.in_flight, stats.available),
    } == {
        "leased on A": [(ids[0], "one", 1)],
        "completions accepted": 2,
        "completed, in flight, available": (2, 0, 0),
    }


async def test_ambiguous_retry_overwritten_is_not_reported_lost(fleet: Fleet) -> None:
    """Defect 2, retry: A's retry CAS lands, B writes the lease object before A
    re-reads; A must report the retry done (it is), not ``lease_lost``, and the
    item comes back once, with its attempt counted once."""
    async with Client(fleet.a.url, timeout=30) as ca, Client(fleet.b.url, timeout=30) as cb:
        await ca.create_queue(Q)
        ids = await ca.produce(Q, ["retried", "other"])
        (first,) = await ca.lease(Q, 1)
        rule = fleet.held_reply(LEASE_PUT)
        retrying = asyncio.create_task(ca.retry(Q, first.token, error="try again"))
        await rule.until_held()  # A's retry has landed; A has not heard back
        on_b = await cb.lease(Q, 1)  # the other item: the retried one is behind it
        rule.release()
        outcome = "done"
        try:
            await asyncio.wait_for(retrying, 30)
        except LeaseLost as exc:
            outcome = f"lease_lost: {exc}"
        again = await drain([ca, cb], 1)
        accepted = await complete_all([ca, cb], [*on_b, *again])
        stats = await cb.stats(Q)

    assert first.id == ids[0] and [i.id for i in on_b] == [ids[1]] and len(rule.matched) == 1
    assert {
        "retry": outcome,
        "delivered again": [(i.id, i.attempts) for i in again],
        "completions accepted": accepted,
        "completed, in flight, available": (stats.completed, stats.in_flight, stats.available),
    } == {
        "retry": "done",
        "delivered again": [(ids[0], 2)],
        "completions accepted": 2,
        "completed, in flight, available": (2, 0, 0),
    }
