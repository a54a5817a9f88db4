"""The README's examples, run as a user runs them, against a real ``okq serve`` node.

Each test takes its code from README.md itself (the README stays the source), so
an example that stops working, or a README edit that breaks one, fails here:

* the worker in a dozen lines stops cleanly on Ctrl-C;
* the library-mode example runs twice in the same folder;
* the worked command-line session dead-letters the item it says it does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from okq import wire as s
from okq.client import Client
from tests.nodes import Node, live_items, okq_node

README = Path(__file__).resolve().parents[2] / "README.md"
README_URL = "http://127.0.0.1:7878"


def readme_block(after: str, lang: str) -> str:
    """The first ```lang block of README.md after the text ``after``."""
    text = README.read_text(encoding="utf-8")
    assert after in text, f"README.md no longer has {after!r}"
    rest = text.split(after, 1)[1]
    fence = f"```{lang}\n"
    assert fence in rest, f"no {lang} block after {after!r}"
    return rest.split(fence, 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("readme-node")
    with okq_node(f"file://{tmp / 'data'}", tmp) as n:
        yield n


def sync(coro: Any) -> Any:
    return asyncio.run(coro)


async def _stats(url: str, queue: str) -> s.StatsResponse:
    async with Client(url) as c:
        return await c.stats(queue)


def env_with_venv(url: str | None = None) -> dict[str, str]:
    """The user's shell after ``source .venv/bin/activate``: okq and python3 on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OKQ_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if url is not None:
        env["OKQ_URL"] = url
    return env


# -- the worker ---------------------------------------------------------------------------


class Lines:
    """A subprocess's stdout, read line by line on a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, cond: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not cond(self.lines):
            assert time.monotonic() < deadline, f"timed out; stdout so far: {self.lines}"
            time.sleep(0.05)

    def join(self) -> None:
        self._thread.join(10)


def test_readme_worker_stops_cleanly_on_ctrl_c(node: Node, tmp_path: Path) -> None:
    code = readme_block("## A worker", "python")
    assert README_URL in code
    script = tmp_path / "worker.py"
    script.write_text(code.replace(README_URL, node.url), encoding="utf-8")

    async def fill() -> None:
        async with Client(node.url) as c:
            await c.create_queue("jobs")
            await c.produce("jobs", ["one", "two", "three"])

    sync(fill())
    proc = subprocess.Popen([sys.executable, "-u", str(script)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_with_venv(), cwd=tmp_path)
    out = Lines(proc.stdout)
    try:
        out.wait_for(lambda lines: len([x for x in lines if x.startswith("got ")]) == 3)
        time.sleep(0.5)  # idle now: the worker waits in a long poll
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.join()
    assert proc.stdout is not None and proc.stderr is not None
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert "Traceback" not in err and "never retrieved" not in err, err
    assert proc.returncode == 0, (proc.returncode, err)
    assert sorted(out.lines[:3]) == ["got one", "got three", "got two"]
    assert out.lines[3:] == ["stopped"]  # the clean stop the README shows
    st = sync(_stats(node.url, "jobs"))
    assert (st.available, st.in_flight, st.completed) == (0, 0, 3)


# -- library mode -------------------------------------------------------------------------


def test_readme_library_example_runs_twice(tmp_path: Path) -> None:
    """Users run an example more than once: the second run must not fail on the queue
    the first one created."""
    script = tmp_path / "library.py"
    script.write_text(readme_block("## Library mode", "python"), encoding="utf-8")
    for run in (1, 2):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=env_with_venv())
        assert proc.returncode == 0, f"run {run}:\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "okq-data").is_dir()  # the example's own store, in its folder


# -- the worked command-line session --------------------------------------------------------


def test_readme_worked_session_dead_letters_the_bad_input(node: Node, tmp_path: Path) -> None:
    """Run the worked session as written; it ends with the dead letter it promises."""
    session = readme_block("A worked session", "sh")
    commands = [line for line in session.splitlines()
                if line.strip() and not line.startswith("source ")]
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(commands)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env=env_with_venv(node.url))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr

    [dead] = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert dead["utf8"] == "three"
    assert dead["meta"]["source_queue"] == "squares" and dead["meta"]["attempts"] == 3
    assert "invalid literal for int()" in dead["meta"]["error"]
    squares = sync(_stats(node.url, "squares"))
    assert (squares.available, squares.in_flight, squares.dead, squares.completed) == (0, 0, 1, 4)
    results = sync(live_items(node.url, "results"))
    assert results == []  # the session leased and completed all four squares
    assert sync(_stats(node.url, "results")).completed == 4

    # what the README says comes out, does
    summary = next(line for line in proc.stderr.splitlines() if line.startswith("work: "))
    promised = "work: 4 completed, 2 retried, 1 dead"
    assert promised in README.read_text(encoding="utf-8")
    assert summary.startswith(promised), summary
    assert "completed 4" in proc.stdout.splitlines()
    assert "exported 1 item to dead.jsonl" in proc.stdout.splitlines()
