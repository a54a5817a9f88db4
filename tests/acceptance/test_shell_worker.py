"""``okq work``: shell commands as workers, against one real ``okq serve`` node.

The worker runs as a real ``okq work`` subprocess; the tests feed its input
queue and read the output and dead-letter queues back with the Python client.
What they hold is checked as multisets: nothing lost, nothing twice.

Several tests guard against worker bugs found while this file was written
(crash after the grace, releases that spent attempts, slow idle stops, oversize
outputs): each fails if its bug comes back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from okq import wire as s
from okq.client import Client
from tests.nodes import Node, free_port, live_items, okq_node

_SCRIPT = Path(sys.executable).with_name("okq")
OKQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "okq.cli"]
PY = sys.executable  # the commands the worker runs

#: stdout and stderr of every worker outside the xfail tests
OUTPUTS: list[str] = []
_IN_XFAIL = [False]


@pytest.fixture(autouse=True)
def _note_xfail(request: pytest.FixtureRequest) -> Iterator[None]:
    _IN_XFAIL[0] = request.node.get_closest_marker("xfail") is not None
    yield
    _IN_XFAIL[0] = False


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("work-node")
    with okq_node(f"file://{tmp / 'data'}", tmp) as n:
        yield n


# -- the queues, through the client ----------------------------------------------------------


def sync(coro: Any) -> Any:
    return asyncio.run(coro)


async def _setup(url: str, queues: dict[str, dict[str, Any]], fill: str | None,
                 items: list[str]) -> None:
    async with Client(url) as c:
        for name, settings in queues.items():
            await c.create_queue(name, **settings)
        for start in range(0, len(items), 1000):
            assert fill is not None
            await c.produce(fill, items[start:start + 1000])


def setup(url: str, queues: dict[str, dict[str, Any]], fill: str | None = None,
          items: list[str] | None = None) -> None:
    sync(_setup(url, queues, fill, items or []))


def items(url: str, queue: str) -> list[s.ItemOut]:
    """Every live item of a queue, without leasing."""
    return sync(live_items(url, queue))


def texts(url: str, queue: str) -> Counter[str]:
    return Counter(i.bytes.decode() for i in items(url, queue))


async def _stats(url: str, queue: str) -> s.StatsResponse:
    async with Client(url) as c:
        return await c.stats(queue)


def stats(url: str, queue: str) -> s.StatsResponse:
    return sync(_stats(url, queue))


def wait_until(what: str, cond: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# -- running okq work ----------------------------------------------------------------------


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    out: str = ""
    err: str = ""
    stopped_in: float | None = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> Worker:
        """Signal the worker and wait; ``stopped_in`` is how long it took to exit."""
        began = time.monotonic()
        self.proc.send_signal(sig)
        return self.wait(timeout, began)

    def wait(self, timeout: float = 120, began: float | None = None) -> Worker:
        began = time.monotonic() if began is None else began
        try:
            self.out, self.err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.out, self.err = self.proc.communicate()
        self.stopped_in = time.monotonic() - began
        if not _IN_XFAIL[0]:
            OUTPUTS.extend([self.out, self.err])
        assert "Traceback" not in self.out + self.err, self.err
        return self

    def summary(self) -> dict[str, int]:
        assert self.proc.returncode == 0, (self.proc.returncode, self.err)
        return json.loads(self.out)


def work(url: str, *args: str) -> Worker:
    """Start ``okq -o json work ARGS`` (its summary comes out as JSON)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OKQ_")}
    env["OKQ_URL"] = url
    proc = subprocess.Popen([*OKQ, "-o", "json", "work", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return Worker(proc)


# -- many items through a command that fails on some of them --------------------------

FLAKY = r"""
n=$(cat)
case $((n % 10)) in
  3) echo "always fails on $n" >&2; exit 3 ;;
  7) if [ ! -e "MARKS/$n" ]; then : > "MARKS/$n"; echo "first try of $n fails" >&2; exit 1; fi ;;
esac
echo $((n * 2))
if [ $((n % 50)) -eq 0 ]; then echo x; fi
exit 0
"""
#: items through the flaky command: 500 in the suite (about 650 runs of it with the
#: retries), ``OKQ_SHELL_ITEMS`` for more
N = int(os.environ.get("OKQ_SHELL_ITEMS", "500"))
MAX_ATTEMPTS = 3


def test_many_items_through_a_failing_shell_command(node: Node, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    setup(node.url, {"k-dlq": {}, "k-out": {},
                     "k-in": {"max_attempts": MAX_ATTEMPTS, "dead_queue": "k-dlq"}},
          "k-in", [str(n) for n in range(1, N + 1)])
    # --limit counts finished items (completed or dead-lettered): all N of them
    worker = work(node.url, "-q", "k-in", "-Q", "k-out", "--concurrency", "8",
                  "--backoff", "0.05", "--limit", str(N),
                  "-c", FLAKY.replace("MARKS", str(marks)))
    summary = worker.wait(timeout=150).summary()

    failing = [n for n in range(1, N + 1) if n % 10 == 3]
    flaky = [n for n in range(1, N + 1) if n % 10 == 7]
    good = [n for n in range(1, N + 1) if n % 10 != 3]
    st = stats(node.url, "k-in")
    assert (st.available, st.in_flight, st.waiting_retry, st.scheduled) == (0, 0, 0, 0)
    assert (st.completed, st.dead_lettered) == (len(good), len(failing))
    assert st.completed + st.dead_lettered == N  # none lost

    expected = Counter(str(n * 2) for n in good) + Counter({"x": N // 50})
    assert texts(node.url, "k-out") == expected  # no duplicates, nothing missing

    dead = items(node.url, "k-dlq")
    assert sorted(int(i.bytes) for i in dead) == failing
    for i in dead:
        assert i.meta is not None
        assert i.meta["source_queue"] == "k-in"
        assert i.meta["attempts"] == MAX_ATTEMPTS
        assert i.meta["error"] == f"exit 3: always fails on {int(i.bytes)}"
    assert sorted(int(p.name) for p in marks.iterdir()) == flaky

    assert summary["completed"] == len(good)
    assert summary["outputs"] == sum(expected.values())
    assert summary["retried"] + summary["dead"] == MAX_ATTEMPTS * len(failing) + len(flaky)
    assert summary["released"] == 0


INVALID = """
import sys
p = sys.stdin.read()
if p == "ok":
    print("fine")
elif p == "long":
    sys.stdout.write("y" * ((1 << 20) + 1) + "\\n")
elif p == "many":
    sys.stdout.write("line\\n" * 1001)
elif p == "big":
    sys.stdout.write(("z" * (1 << 20) + "\\n") * 5)
"""


def test_invalid_output_goes_to_the_dead_letter_queue_with_its_reason(node: Node) -> None:
    setup(node.url, {"v-dlq": {}, "v-out": {}, "v-in": {"max_attempts": 3,
                                                        "dead_queue": "v-dlq"}},
          "v-in", ["ok", "long", "many", "big"])
    summary = work(node.url, "-q", "v-in", "-Q", "v-out", "--limit", "4", "--",
                   PY, "-c", INVALID).wait().summary()
    assert summary == {"completed": 1, "retried": 0, "dead": 3, "released": 0, "outputs": 1}
    assert texts(node.url, "v-out") == Counter(["fine"])
    reasons = {i.bytes.decode(): i.meta["error"] for i in items(node.url, "v-dlq") if i.meta}
    assert reasons == {
        "long": f"invalid output: output line 1 is over {1 << 20} bytes",
        "many": "invalid output: output has 1001 lines; the limit is 1000",
        "big": f"invalid output: output is {5 * ((1 << 20) + 1)} bytes; "
               f"the limit is {4 << 20}",
    }
    st = stats(node.url, "v-in")
    assert (st.available, st.in_flight, st.completed, st.dead_lettered) == (0, 0, 1, 3)


# -- SIGTERM ----------------------------------------------------------------------------------

#: Logs its item (one line per command started), takes 0.2 s, prints the item: a shell
#: script, not a Python one, as 200 Python starts would cost the suite 8 s of CPU.
SLOW = """p=$(cat); printf '%s\\n' "$p" >> "$1"; sleep 0.2; printf '%s\\n' "$p"
"""


def test_sigterm_finishes_running_commands_then_a_second_run_finishes_the_queue(
        node: Node, tmp_path: Path) -> None:
    n = 200
    inputs = [f"t{k:03d}" for k in range(n)]
    setup(node.url, {"t-in": {}, "t-out": {}}, "t-in", inputs)
    runs = tmp_path / "runs.log"  # one line per command started
    # a lease far longer than the test: no delivery can expire and run twice
    opts = ["-q", "t-in", "-Q", "t-out", "--concurrency", "4", "--lease-timeout", "300",
            "--grace", "20"]
    command = ["--", "sh", "-c", SLOW, "slow", str(runs)]
    first = work(node.url, *opts, *command)
    wait_until("40 outputs", lambda: stats(node.url, "t-out").available >= 40)
    one = first.stop().summary()
    # commands take 0.2 s: far under the 30 s grace, with room for a busy machine
    assert first.stopped_in is not None and first.stopped_in < 10

    st = stats(node.url, "t-in")
    assert st.in_flight == 0  # everything running finished; nothing left leased
    assert st.completed == one["completed"] == one["outputs"]
    assert st.available == n - one["completed"]
    assert one["completed"] < n  # stopped in the middle
    started = Counter(runs.read_text().split())
    assert set(started.values()) == {1}
    assert texts(node.url, "t-out") == started  # every command it started finished

    two = work(node.url, *opts, "--limit", str(n - one["completed"]), *command
               ).wait().summary()
    assert two["completed"] == n - one["completed"]

    st = stats(node.url, "t-in")
    assert (st.available, st.in_flight, st.waiting_retry, st.completed) == (0, 0, 0, n)
    assert texts(node.url, "t-out") == Counter(inputs)  # every item exactly once
    assert Counter(runs.read_text().split()) == Counter(inputs)  # and run exactly once


SLEEPER = "import sys, time; sys.stdin.read(); time.sleep(10)"


def test_sigterm_after_grace_releases_running_items(node: Node) -> None:
    setup(node.url, {"g-in": {}}, "g-in", ["g1", "g2", "g3", "g4"])
    worker = work(node.url, "-q", "g-in", "--concurrency", "4", "--grace", "0.5",
                  "--", PY, "-c", SLEEPER)
    wait_until("four leases", lambda: stats(node.url, "g-in").in_flight == 4)
    time.sleep(0.5)  # the commands are running
    summary = worker.stop().summary()
    assert worker.stopped_in is not None and worker.stopped_in < 8  # grace 0.5; sleeps 10 s
    assert summary == {"completed": 0, "retried": 0, "dead": 0, "released": 4, "outputs": 0}

    st = stats(node.url, "g-in")
    assert (st.available, st.in_flight, st.dead_lettered, st.completed) == (4, 0, 0, 0)
    released = items(node.url, "g-in")
    assert sorted(i.bytes.decode() for i in released) == ["g1", "g2", "g3", "g4"]
    assert {i.error for i in released} == {"worker stopped before the command finished"}


def test_sigterm_release_does_not_dead_letter(node: Node) -> None:
    setup(node.url, {"ga-dlq": {}, "ga-in": {"max_attempts": 1, "dead_queue": "ga-dlq"}},
          "ga-in", ["a1", "a2"])
    worker = work(node.url, "-q", "ga-in", "--concurrency", "2", "--grace", "0.5",
                  "--", PY, "-c", SLEEPER)
    wait_until("two leases", lambda: stats(node.url, "ga-in").in_flight == 2)
    time.sleep(0.5)
    assert worker.stop().summary()["released"] == 2
    st = stats(node.url, "ga-in")
    assert (st.available, st.dead_lettered) == (2, 0)


def test_sigterm_grace_with_a_shell_whose_child_keeps_the_pipes(node: Node) -> None:
    setup(node.url, {"gs-in": {}}, "gs-in", ["s1", "s2"])
    worker = work(node.url, "-q", "gs-in", "--concurrency", "2", "--grace", "0.5",
                  "-c", "sleep 8; echo done")
    wait_until("two leases", lambda: stats(node.url, "gs-in").in_flight == 2)
    time.sleep(0.5)
    worker.proc.send_signal(signal.SIGTERM)
    _, err = worker.proc.communicate(timeout=30)
    assert "Traceback" not in err, err[-2000:]
    assert worker.proc.returncode == 0
    st = stats(node.url, "gs-in")
    assert (st.available, st.in_flight) == (2, 0)


def test_idle_worker_stops_promptly(node: Node) -> None:
    setup(node.url, {"idle-in": {}})
    worker = work(node.url, "-q", "idle-in", "--concurrency", "2", "--grace", "0.5",
                  "--", "cat")
    time.sleep(2)  # started, and waiting for items
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(10)
    except subprocess.TimeoutExpired:
        worker.proc.kill()  # measured: no need to sit out the rest of the poll
    stopped_in = time.monotonic() - began
    worker.wait(30)
    # within one long poll (2 s) and the process's exit, with room for a busy machine
    assert stopped_in < 6, f"stopped in {stopped_in:.1f}s"


def test_summary_counts_items_dead_lettered_by_max_attempts(node: Node) -> None:
    setup(node.url, {"sd-dlq": {}, "sd-in": {"max_attempts": 2, "dead_queue": "sd-dlq"}},
          "sd-in", ["d1", "d2"])
    summary = work(node.url, "-q", "sd-in", "--backoff", "0.05", "--limit", "2",
                   "--", PY, "-c", "import sys; sys.exit(1)").wait().summary()
    assert stats(node.url, "sd-in").dead_lettered == 2
    assert (summary["dead"], summary["retried"]) == (2, 2)


FAIL_ONCE = """
import os, sys
payload = sys.stdin.read()
mark = os.path.join(sys.argv[1], payload)
if not os.path.exists(mark):
    open(mark, "w").close()
    sys.exit("first try fails")
print(payload)
"""


def test_limit_counts_finished_items_not_retries(node: Node, tmp_path: Path) -> None:
    """--limit 1 means one item finished: a retry is not the one item; the worker goes
    on until the retried item completes (or is dead-lettered)."""
    setup(node.url, {"lim-out": {}, "lim-in": {"max_attempts": 3}}, "lim-in", ["f1"])
    summary = work(node.url, "-q", "lim-in", "-Q", "lim-out", "--backoff", "0.05",
                   "--limit", "1", "--", PY, "-c", FAIL_ONCE, str(tmp_path)).wait().summary()
    assert summary == {"completed": 1, "retried": 1, "dead": 0, "released": 0, "outputs": 1}
    assert texts(node.url, "lim-out") == Counter(["f1"])  # completed, after its retry
    st = stats(node.url, "lim-in")
    assert (st.completed, st.in_flight, st.waiting_retry) == (1, 0, 0)


def test_limit_with_concurrency_stops_at_exactly_the_limit(node: Node, tmp_path: Path) -> None:
    setup(node.url, {"limc-in": {"max_attempts": 3}}, "limc-in", [f"c{n}" for n in range(12)])
    summary = work(node.url, "-q", "limc-in", "--concurrency", "4", "--backoff", "0.05",
                   "--limit", "5", "--", PY, "-c", FAIL_ONCE, str(tmp_path)).wait().summary()
    assert summary["completed"] == 5 and summary["released"] == 0
    st = stats(node.url, "limc-in")
    assert (st.completed, st.in_flight) == (5, 0)


def test_work_help_says_what_limit_counts() -> None:
    proc = subprocess.run([*OKQ, "work", "--help"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "stop once this many items are finished: completed or dead-lettered" in text
    assert "a retry does not count" in text


def test_output_over_the_node_item_limit_is_dead_lettered(tmp_path: Path) -> None:
    with okq_node(f"file://{tmp_path / 'small'}", tmp_path,
                  extra=["--max-item-bytes", "1024"]) as small:
        setup(small.url, {"sm-dlq": {}, "sm-out": {},
                          "sm-in": {"max_attempts": 2, "dead_queue": "sm-dlq"}},
              "sm-in", ["big"])
        work(small.url, "-q", "sm-in", "-Q", "sm-out", "--limit", "1", "--",
             PY, "-c", "print('x' * 2000)").wait()
        st = stats(small.url, "sm-in")
        assert (st.in_flight, st.dead_lettered) == (0, 1)
        [dead] = items(small.url, "sm-dlq")
        assert dead.meta and "invalid output" in str(dead.meta["error"])


def test_work_started_while_its_node_is_down_waits_for_it(tmp_path: Path) -> None:
    """It used to exit at once with "cannot reach okq"; and it leases for the queue's
    lease timeout (7 s here), not a lease timeout of its own (it was 60 s)."""
    port, data = free_port(), f"file://{tmp_path / 'data'}"
    with okq_node(data, tmp_path, port=port) as first:
        setup(first.url, {"late": {"lease_timeout": 7}}, "late", ["x"])
    mark = tmp_path / "started"
    worker = work(f"http://127.0.0.1:{port}", "-q", "late", "--limit", "1", "--", PY, "-c",
                  f"import sys, time; sys.stdin.read(); open({str(mark)!r}, 'w'); "
                  "time.sleep(2)")
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # the node stays down for 2 s: it keeps waiting
        assert worker.proc.poll() is None, worker.wait().err
        time.sleep(0.1)
    with okq_node(data, tmp_path, port=port) as again:
        wait_until("the command runs", mark.exists, 30)
        [leased] = items(again.url, "late")
        assert leased.state == "leased" and leased.ready_at is not None
        assert leased.ready_at.timestamp() - time.time() < 7.5
        assert worker.wait(60).summary()["completed"] == 1
    assert "cannot reach okq" in worker.err  # said why it waited


def test_no_traceback_in_any_output(node: Node) -> None:
    assert not [o for o in OUTPUTS if "Traceback" in o]
    assert "Traceback" not in node.output()
