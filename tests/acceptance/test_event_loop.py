"""``okq serve`` on either event loop (``--event-loop``, okq/loops.py): the same
node, said in its start-up line, and a value it does not know refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from okq.client import Client
from tests.nodes import okq_node


@pytest.mark.parametrize("choice", ["default", "asyncio", "uvloop"])
async def test_a_node_serves_on_the_loop_it_names(choice: str, tmp_path: Path) -> None:
    if choice != "asyncio":
        pytest.importorskip("uvloop")
    extra = ["--log-level", "INFO"] + ([] if choice == "default" else ["--event-loop", choice])
    with okq_node(f"file://{tmp_path / 'data'}", tmp_path, extra=extra) as n:
        async with Client(n.url) as c:
            await c.create_queue("loops")
            ids = await c.produce("loops", ["a", "b", "c"])
            leased = await c.lease("loops", 3)
            assert sorted(i.id for i in leased) == sorted(ids)
            assert await c.complete("loops", [i.token for i in leased]) == 3
        assert n.stop() == 0
    said = [line for line in n.output().splitlines() if "okq listening on" in line]
    assert len(said) == 1, n.output()
    want = "asyncio" if choice == "asyncio" else "uvloop "
    assert f"event loop {want}" in said[0], said[0]


def test_an_unknown_event_loop_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "okq.cli", "serve", "--store", "memory://",
                          "--port", "0", "--event-loop", "trio"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "--event-loop: Input should be 'auto', 'uvloop' or 'asyncio'" in run.stderr
