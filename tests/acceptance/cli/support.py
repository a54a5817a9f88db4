"""Running the ``okq`` command line as a user runs it, for the tests beside this module.

Every command runs as a process of its own (forked by tests/cliforks.py from
one that has imported what every start imports; the tests that watch a run go
on, signal it or read it as it streams start the ``okq`` script next to
``sys.executable``) with ``OKQ_URL`` set, and the tests read what a user reads:
text tables and messages, ``--output json``, exit codes. Bulk checks (thousands
of exported items) read the queues back with the Python client.

Error paths exit non-zero with a one-line ``error:`` message (or click's usage
message, exit 2) and never a traceback: every run is checked for ``Traceback``,
and so is each test file's node log at the file's end (``check_no_traceback``).

Several tests guard against bugs found while these tests were written (markup in
output, multi-line errors, partial produces, lost export records): each fails
if its bug comes back.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from okq import wire as s
from okq.client import Client
from tests import cliforks
from tests.cliforks import OKQ  # noqa: F401  (the tests that start it themselves)
from tests.nodes import Node, live_items

WIDE = "200"  # table width: rich wraps to 80 columns when stdout is not a terminal

#: every stdout and stderr of the file's runs (but those of the xfail tests, which
#: pin crashes), for the traceback check at the end
OUTPUTS: list[str] = []
IN_XFAIL = [False]



def record(*outputs: str) -> None:
    if not IN_XFAIL[0]:
        OUTPUTS.extend(outputs)


# -- running the CLI ------------------------------------------------------------------


@dataclass
class Run:
    args: tuple[str, ...]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def error_line(self) -> str:
        """The one-line message of a failed command (ours, or click's usage error)."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        if self.rc == 2:  # click: "Usage: ...", "Try ...", "Error: ..."
            assert lines and lines[0].startswith("Usage: "), self
            assert lines[-1].startswith("Error: "), self
            return lines[-1]
        assert len(lines) == 1, f"expected one line of stderr, got {lines}"
        assert lines[0].startswith("error: "), self
        return lines[0]


def env_for(url: str | None, extra: dict[str, str] | None = None,
            columns: str | None = WIDE) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OKQ_") and k not in ("COLUMNS", "LINES")}
    if url is not None:
        env["OKQ_URL"] = url
    if columns is not None:
        env["COLUMNS"] = columns
    env.update(extra or {})
    return env


class Cli:
    """``cli("stats", "q")`` runs ``okq stats q`` against the module's node."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp

    def __call__(self, *args: str, stdin: str | None = None, url: str | None = "",
                 env: dict[str, str] | None = None, columns: str | None = WIDE,
                 timeout: float = 180) -> Run:
        proc = cliforks.run(args, input=stdin if stdin is not None else "", timeout=timeout,
                            env=env_for(self.url if url == "" else url, env, columns))
        run = Run(args, proc.returncode, proc.stdout, proc.stderr)
        record(run.out, run.err)
        assert "Traceback" not in run.out + run.err, f"okq {' '.join(args)}:\n{run.err}"
        return run

    def ok(self, *args: str, **kw: Any) -> Run:
        run = self(*args, **kw)
        assert run.rc == 0, f"okq {' '.join(args)} exited {run.rc}:\n{run.out}{run.err}"
        return run

    def js(self, *args: str, **kw: Any) -> Any:
        return self.ok("-o", "json", *args, **kw).json()

    def fails(self, *args: str, code: int = 1, **kw: Any) -> str:
        """Run a command that must fail; return its one-line message."""
        return self.check_failed(self(*args, **kw), code)

    @staticmethod
    def check_failed(run: Run, code: int = 1) -> str:
        assert run.rc == code, f"okq {' '.join(run.args)}: exit {run.rc}, wanted {code}\n{run.err}"
        assert run.out == "", run.out
        return run.error_line()

    def many_fail(self, cases: list[tuple[tuple[str, ...], int, str]], **kw: Any) -> None:
        """Run independent failing commands side by side (each CLI start costs most of a
        second); each ``(args, exit code, fragment)`` must fail with that code and a
        message containing the fragment."""
        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda case: self(*case[0], **kw), cases))
        for (args, code, fragment), run in zip(cases, runs, strict=True):
            msg = self.check_failed(run, code)
            assert fragment in msg, (args, msg)


def rows(text: str) -> list[list[str]]:
    """The body rows of a rich table, as lists of stripped cells."""
    return [[c.strip() for c in line.strip()[1:-1].split("│")]
            for line in text.splitlines() if line.startswith("│")]


def sync(coro: Any) -> Any:
    return asyncio.run(coro)


def live(url: str, queue: str) -> list[s.ItemOut]:
    return sync(live_items(url, queue))


def payloads(items: list[s.ItemOut]) -> Counter[bytes]:
    return Counter(i.bytes for i in items)


async def _stats(url: str, queue: str) -> s.StatsResponse:
    async with Client(url) as c:
        return await c.stats(queue)


def stats(url: str, queue: str) -> s.StatsResponse:
    return sync(_stats(url, queue))


async def _produce(url: str, queue: str, *items: str) -> None:
    async with Client(url) as c:
        await c.produce(queue, list(items))


async def _make_queue(url: str, name: str, items: tuple[str, ...],
                      settings: dict[str, Any]) -> None:
    async with Client(url) as c:
        await c.create_queue(name, **settings)
        if items:
            await c.produce(name, list(items))


def make_queue(url: str, name: str, *items: str, **settings: Any) -> None:
    """Set-up through the client, where the CLI is not what a test is about."""
    sync(_make_queue(url, name, items, settings))



def produce(url: str, queue: str, *items: str) -> None:
    sync(_produce(url, queue, *items))


def wait_for(cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def check_no_traceback(node: Node) -> None:
    """No run of the CLI in this process printed a traceback, nor did ``node``."""
    assert not [o for o in OUTPUTS if "Traceback" in o]
    assert "Traceback" not in node.output()
