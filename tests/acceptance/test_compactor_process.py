"""The compactor as a process (``python -m compactor`` / ``okq-compactor``) next to
a real ``okq serve`` node on a file store, driven by the Python client.

The command refuses a safety age below the nodes' publish deadline, and a pass
leaves segments younger than the publish deadline plus twice the clock-skew
bound alone. So the history a pass is to fold, merge or collect is written
in-process by an engine on a clock two hours back, and its files are dated back
as far; what the node adds during a test is young and stays.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from okq import Engine, ManualClock
from okq.client import Client
from okq.dev.servers import client_environment
from okq.store import FileStore, list_all
from tests.engines import make_engine
from tests.nodes import free_port, okq_node
from tests.s3proxy import Rule, S3Proxy
from tests.servers import BUCKET

PASS_LINE = re.compile(
    r"pass over namespace default: (?P<queues>\d+) queues, (?P<folded>\d+) segments folded, "
    r"(?P<merged>\d+) merged into (?P<into>\d+), (?P<moved>\d+) items moved, "
    r"(?P<expired>\d+) expired, (?P<deleted>\d+) objects \((?P<bytes>\d+) bytes\) deleted")


def run_compactor(store_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compactor", "--store", store_url, "--once",
         "--safety-age", "61", "--lease-grace", "1", "--log-level", "INFO", *extra],
        capture_output=True, text=True, timeout=60, check=False)


def past_engine(root: Path) -> Engine:
    """An engine whose clock is two hours back: it writes old history."""
    return make_engine(FileStore(root), ManualClock(time.time_ns() // 1_000_000 - 7_200_000))


def date_back(root: Path, seconds: float = 7200) -> None:
    """Make every object look ``seconds`` old to the collector."""
    then = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".locks"]
        for name in filenames:
            os.utime(Path(dirpath) / name, (then, then))


async def objects(root: Path) -> list[str]:
    store = FileStore(root)
    try:
        return [info.key async for info in list_all(store, "default/")
                if "/presence/" not in info.key]  # the node's own report (okq/presence.py)
    finally:
        await store.close()


def test_okq_compactor_help() -> None:
    exe = Path(sys.executable).parent / "okq-compactor"
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--once", "--safety-age", "--interval", "--store", "--metrics-port"):
        assert flag in proc.stdout


async def test_compactor_once_next_to_a_running_node(tmp_path: Path) -> None:
    root = tmp_path / "data"
    url = f"file://{root}"
    past = past_engine(root)
    await past.create_queue("jobs")
    for n in range(6):  # six segments, every item completed
        await past.produce("jobs", [f"done-{n}-{k}".encode() for k in range(5)])
    items = await past.lease("jobs", 100)
    assert len(items) == 30
    await past.complete([i.token for i in items])
    # one segment with live items only: not worth rewriting, so left alone
    keep = await past.produce("jobs", [f"keep-{k}".encode() for k in range(4)])
    date_back(root)
    with okq_node(url, tmp_path) as node:
        async with Client(node.url) as c:
            before = await c.stats("jobs")
            assert (before.available, before.completed, before.segments) == (4, 30, 7)
            # the manifest, its two chunks of 3 segments (tests' engines cut chunks of 3),
            # the segments, the lease objects
            assert len(await objects(root)) == 1 + 2 + 7 + 6

            proc = run_compactor(url)
            assert proc.returncode == 0, proc.stderr
            lines = [m for m in map(PASS_LINE.search, proc.stderr.splitlines()) if m]
            assert len(lines) == 1, proc.stderr
            report = {k: int(v) for k, v in lines[0].groupdict().items()}
            assert report["queues"] == 1 and report["folded"] == 6, proc.stderr
            # 6 segments and their lease objects, and the chunks that listed them
            assert report["deleted"] == 14 and report["bytes"] > 0, proc.stderr
            assert (report["merged"], report["moved"], report["expired"]) == (0, 0, 0)
            assert sorted(await objects(root)) == sorted(
                ["default/manifests/jobs", f"default/segments/jobs/{keep[0].split('.')[0]}"])

            # The node still serves the queue, and its numbers add up.
            after = await c.stats("jobs")
            assert (after.available, after.in_flight, after.completed, after.segments) == (
                4, 0, 0, 1)
            new = await c.produce("jobs", ["fresh"])
            got = await c.lease("jobs", 10)
            assert [i.id for i in got] == keep + new
            assert await c.complete("jobs", [i.token for i in got]) == 5
            final = await c.stats("jobs")
            assert (final.available, final.in_flight, final.completed, final.segments) == (
                0, 0, 5, 2)

            # A second pass folds the old segment and collects it; its lease object,
            # written by the node just now, outlives it by the safety age. The
            # segment the node just wrote is younger than the publish deadline plus
            # twice the skew bound: it stays listed (finished) until a later pass.
            again = run_compactor(url)
            assert again.returncode == 0, again.stderr
            assert (m := PASS_LINE.search(again.stderr)) and int(m["folded"]) == 1
            fresh_segment, kept_segment = new[0].split(".")[0], keep[0].split(".")[0]
            assert sorted(await objects(root)) == sorted([
                "default/manifests/jobs", f"default/segments/jobs/{fresh_segment}",
                f"default/leases/jobs/{fresh_segment}", f"default/leases/jobs/{kept_segment}"])
            assert await c.lease("jobs", 10) == []
            assert (await c.stats("jobs")).segments == 1


async def test_narrow_segments_stay_deliverable_after_compactor_once(tmp_path: Path) -> None:
    root = tmp_path / "data"
    url = f"file://{root}"
    past = past_engine(root)
    await past.create_queue("jobs")
    for n in range(2):  # two narrow segments: a merge candidate group
        await past.produce("jobs", [f"{n}-{k}-".encode() + b"x" * 1000 for k in range(200)])
    date_back(root)
    with okq_node(url, tmp_path) as node:
        async with Client(node.url) as c:
            proc = run_compactor(url)
            assert proc.returncode == 0, proc.stderr
            assert (m := PASS_LINE.search(proc.stderr)) and int(m["into"]) == 1, proc.stderr
            assert (await c.stats("jobs")).available == 400
            got = []
            while batch := await c.lease("jobs", 1000):
                got += batch
            assert len(got) == 400


async def test_all_namespaces(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root)
    for ns in ("team-a", "team-b"):
        e = make_engine(store, namespace=ns)
        await e.create_queue("q")
        await e.produce("q", [b"x", b"y"])
        await e.complete([i.token for i in await e.lease("q", 10)])
    date_back(root)
    proc = run_compactor(f"file://{root}", "--all-namespaces")
    assert proc.returncode == 0, proc.stderr
    for ns in ("team-a", "team-b"):
        assert f"pass over namespace {ns}: 1 queues, 1 segments folded" in proc.stderr
    assert [i.key async for i in list_all(store, "")] == [
        "team-a/manifests/q", "team-b/manifests/q"]


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_compactor_exports_its_store_requests_and_sweeps_every_gc_every(tmp_path: Path) -> None:
    """The compactor's object-store requests are part of the fleet's bill: exported
    under the nodes' metric name. With ``--gc-every 3`` the LISTs of the garbage
    sweep are paid on one pass in three."""
    root = tmp_path / "data"

    async def make_queue() -> None:
        async with make_engine(FileStore(root), ManualClock()) as engine:
            await engine.create_queue("q")

    asyncio.run(make_queue())
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "compactor", "--store", f"file://{root}", "--interval", "0.4",
         "--gc-every", "3", "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lists = _lists_per_pass(port, wanted=7, timeout=120)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert len(lists) >= 7, f"too few passes seen: {lists}\n{err}"
    # pass n (counted from 1) sweeps when n - 1 is a multiple of 3: passes 1, 4, 7...
    sweeping = [d for n, d in lists.items() if (n - 1) % 3 == 0]
    quiet = [d for n, d in lists.items() if (n - 1) % 3 != 0]
    assert sweeping and len(quiet) >= 3, lists
    assert quiet.count(min(quiet)) >= 3 and min(sweeping) > min(quiet), lists


def _lists_per_pass(port: int, wanted: int, timeout: float) -> dict[int, float]:
    """The LISTs of each compactor pass (by its number), read from /metrics until
    ``wanted`` passes are known or ``timeout`` seconds pass. A scrape can land in the
    middle of the next pass, so each count of passes keeps the fewest LISTs seen with
    it (a scrape between passes); a pass is known once the passes before and after it
    were both seen (a scrape may miss a pass on a loaded machine)."""
    fewest: dict[int, float] = {}  # passes done -> the fewest LISTs seen with that count
    known: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = _scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            time.sleep(0.05)
            continue
        assert m['okq_store_requests_total{operation="get"}'] > 0
        done = int(m["okq_compactor_passes_total"])
        seen = m['okq_store_requests_total{operation="list"}']
        fewest[done] = min(seen, fewest.get(done, seen))
        known = _settled(fewest, done)
        if len(known) >= wanted:
            return known
        time.sleep(0.02)
    return known


def _settled(fewest: dict[int, float], done: int) -> dict[int, float]:
    """The LISTs of pass n for every n whose count and the one before were seen, and
    which is over (no scrape will see n passes done again). Not pass 1: the compactor
    starts it at once, so no scrape may have come before its LISTs (a loaded machine
    once read it as 0)."""
    return {n: fewest[n] - fewest[n - 1] for n in fewest
            if n > 1 and n - 1 in fewest and n < done}


@pytest.mark.s3
def test_a_store_error_cuts_a_pass_short_and_the_compactor_goes_on(
        seaweed_endpoint: str) -> None:
    """A long-running compactor outlives the store's errors: a pass they cut short is
    logged, and the next pass runs (it used to exit on the first 500)."""
    port = free_port()
    with S3Proxy(seaweed_endpoint) as proxy:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compactor", "--store", f"s3://{BUCKET}/{uuid.uuid4().hex}",
             "--endpoint-url", proxy.endpoint, "--interval", "0.3",
             "--metrics-port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=client_environment())
        try:
            before = _passes_after(port, 1)
            rule = proxy.add(Rule(path="/", times=3, forward=False, reply="error"))
            deadline = time.monotonic() + 20
            while len(rule.matched) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(rule.matched) == 3, rule.matched
            after = _passes_after(port, before + 2)
            assert proc.poll() is None and after >= before + 2
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
    assert "pass cut short by the store" in err, err


def _passes_after(port: int, at_least: float, timeout: float = 30) -> float:
    """The compactor's passes so far, once there are ``at_least``."""
    deadline = time.monotonic() + timeout
    passes = 0.0
    while time.monotonic() < deadline:
        try:
            passes = _scrape(f"http://127.0.0.1:{port}/metrics")["okq_compactor_passes_total"]
        except (OSError, KeyError):
            passes = 0.0
        if passes >= at_least:
            return passes
        time.sleep(0.05)
    raise AssertionError(f"only {passes} compactor passes in {timeout}s")
