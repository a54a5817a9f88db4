"""A sequencer holder that hangs, as real processes see it: SIGSTOP (a GC pause, a
frozen VM and a half-open connection look the same from outside). With the role's
TTL at its default (45 s), writes through the other node resume within seconds:
the forward that waits on the holder pings it, finds it mute and claims its role.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from okq.client import Client
from okq.dev.servers import ServerMissing
from okq.errors import OkqError
from okq.wire import ProduceItem
from tests.haproxy import HaproxyServer, haproxy_binary
from tests.nodes import free_port, okq_node


def _health(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
        return dict(json.load(resp))


async def _produce_until_acknowledged(client: Client, body: str, within: float) -> list[str]:
    """Produce ``body`` with its key until acknowledged; the errors seen meanwhile."""
    began, outcomes = time.monotonic(), []
    while time.monotonic() - began < within:
        try:
            await client.produce("jobs", [ProduceItem(utf8=body, key=body)])
            return outcomes
        except OkqError as exc:  # outcome unknown: retried with its key
            outcomes.append(type(exc).__name__)
    raise AssertionError(f"{body!r} not acknowledged in {within:g} s ({outcomes})")


async def test_writes_resume_within_seconds_of_the_holder_hanging(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    flags = ["--sequencer", "--role-ttl", "45"]
    with okq_node(store, tmp_path, extra=flags) as a, okq_node(store, tmp_path, extra=flags) as b:
        async with Client(a.url, timeout=30) as ca, Client(b.url, timeout=30) as cb:
            await ca.create_queue("jobs")
            await ca.produce("jobs", ["first"])  # a claims the role
            await cb.produce("jobs", ["second"])  # forwarded to a
            assert _health(a.url).get("roles") == [0]
            a.proc.send_signal(signal.SIGSTOP)
            try:
                stopped = time.monotonic()
                outcomes = await _produce_until_acknowledged(cb, "third", within=20)
                resumed = time.monotonic() - stopped
                print(f"writes resumed {resumed:.2f} s after the stop ({outcomes})")
                assert resumed < 5, f"writes resumed after {resumed:.1f} s ({outcomes})"
                assert _health(b.url).get("roles") == [0], "b took the hung holder's role"
            finally:
                a.proc.send_signal(signal.SIGCONT)
            leased = await cb.lease("jobs", 10)
            assert sorted(i.bytes for i in leased) == [b"first", b"second", b"third"]


async def test_through_haproxy_writes_resume_and_the_hung_node_is_left_out(
        tmp_path: Path) -> None:
    """deploy/haproxy/haproxy.cfg in front of two nodes: HAProxy's own health checks
    take the hung holder out of the rotation and cut the calls it holds, so a
    client's writes through it resume within 5 s (nginx, with no active checks,
    sends a third of them to the hung node until its 5 s timeout), and every call
    after that goes to the live node."""
    try:
        haproxy_binary()
    except ServerMissing as exc:
        pytest.skip(str(exc))
    store = f"file://{tmp_path / 'store'}"
    flags = ["--sequencer", "--role-ttl", "45"]
    with okq_node(store, tmp_path, extra=flags) as a, okq_node(store, tmp_path, extra=flags) as b, \
            HaproxyServer(tmp_path / "haproxy", free_port(),
                          [a.url.removeprefix("http://"), b.url.removeprefix("http://")]) as lb:
        async with Client(a.url, timeout=30) as ca, Client(lb.url, timeout=30) as c:
            await ca.create_queue("jobs")
            await ca.produce("jobs", ["first"])  # a claims the role
            for n in range(4):  # both nodes in the rotation
                await c.produce("jobs", [f"before-{n}"])
            a.proc.send_signal(signal.SIGSTOP)
            try:
                stopped = time.monotonic()
                outcomes = await _produce_until_acknowledged(c, "during", within=20)
                resumed = time.monotonic() - stopped
                print(f"writes through HAProxy resumed {resumed:.2f} s after the stop "
                      f"({outcomes})")
                assert resumed < 5, f"writes resumed after {resumed:.1f} s ({outcomes})"
                slowest = 0.0
                for n in range(10):  # none goes to the hung node any more
                    began = time.monotonic()
                    await c.produce("jobs", [f"after-{n}"])
                    slowest = max(slowest, time.monotonic() - began)
                assert slowest < 2, f"a call took {slowest:.1f} s: sent to the hung node?"
            finally:
                a.proc.send_signal(signal.SIGCONT)
            leased = await c.lease("jobs", 100)
            assert len(leased) == 1 + 4 + 1 + 10, sorted(i.bytes for i in leased)
