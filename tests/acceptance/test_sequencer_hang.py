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

from okq.client import Client
from okq.errors import OkqError
from okq.wire import ProduceItem
from tests.nodes import okq_node


def _health(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
        return dict(json.load(resp))


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
                outcomes: list[str] = []
                while time.monotonic() - stopped < 20:
                    try:
                        await cb.produce("jobs", [ProduceItem(utf8="third", key="third")])
                        break
                    except OkqError as exc:  # outcome unknown: retried with its key
                        outcomes.append(type(exc).__name__)
                resumed = time.monotonic() - stopped
                print(f"writes resumed {resumed:.2f} s after the stop ({outcomes})")
                assert resumed < 5, f"writes resumed after {resumed:.1f} s ({outcomes})"
                assert _health(b.url).get("roles") == [0], "b took the hung holder's role"
            finally:
                a.proc.send_signal(signal.SIGCONT)
            leased = await cb.lease("jobs", 10)
            assert sorted(i.bytes for i in leased) == [b"first", b"second", b"third"]
