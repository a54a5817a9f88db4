"""``okq-compactor`` as a user runs it: its help, and the durations it refuses.

A nonsense duration used to be accepted: ``--once --safety-age -600`` raised the
GC floor ten minutes into the future, and every produce then failed until the
clock caught up. Each such value must be refused before anything runs (exit
code 2, an error naming the flag), and the queue must keep working.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from okq.clock import SystemClock
from okq.store import FileStore
from tests.engines import make_engine

EXE = Path(sys.executable).parent / "okq-compactor"


def compactor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_only_what_the_compactor_uses(flag: str) -> None:
    proc = compactor(flag)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for used in ("--store", "--endpoint-url", "--namespace", "--all-namespaces", "--once",
                 "--interval", "--safety-age", "--lease-grace", "--metrics-port"):
        assert used in text, f"{used} missing from:\n{text}"
    for node_only in ("--port", "--linger", "--api-keys", "--max-wait", "--signing-keys",
                      "--max-batch"):
        assert not re.search(rf"(^|\s){node_only}\b", text), f"{node_only} in:\n{text}"
    for number, kind in (("--interval", "FLOAT"), ("--safety-age", "FLOAT"),
                         ("--lease-grace", "FLOAT"), ("--metrics-port", "INTEGER")):
        shown = re.search(rf"{number} (\S+)", text)
        assert shown and shown[1] == kind, f"{number} is shown as {shown and shown[1]}"


async def produce_and_lease(root: Path, payload: bytes) -> None:
    """A produce on the real clock lands, and the item can be leased and completed."""
    engine = make_engine(FileStore(root), SystemClock())
    try:
        [item_id] = await engine.produce("q", [payload])
        got = await engine.lease("q", 10)
        assert [g.id for g in got] == [item_id]
        await engine.complete([g.token for g in got])
    finally:
        await engine.close()


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--safety-age", "-600", "not a positive number"),
    ("--safety-age", "nan", "not a finite number"),
    ("--safety-age", "inf", "not a finite number"),
    ("--safety-age", "0", "not a positive number"),
    ("--safety-age", "30", "publish deadline (60 s)"),
    ("--lease-grace", "-60", "not a positive number"),
    ("--lease-grace", "nan", "not a finite number"),
    ("--lease-grace", "0", "not a positive number"),
    ("--interval", "0", "not a positive number"),
    ("--interval", "inf", "not a finite number"),
])
async def test_nonsense_durations_are_refused_and_the_queue_keeps_working(
        tmp_path: Path, flag: str, value: str, why: str) -> None:
    root = tmp_path / "data"
    engine = make_engine(FileStore(root), SystemClock())
    await engine.create_queue("q")
    await engine.close()
    await produce_and_lease(root, b"before")

    proc = compactor("--store", f"file://{root}", "--once", flag, value)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert f"'{flag}'" in error and why in error, error

    await produce_and_lease(root, b"after")
