"""Start real ``okq serve`` processes on loopback for acceptance tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from okq.client import Client
from okq.wire import ItemOut

KEYS = "acceptance-key-0123456789abcdef"


async def live_items(url: str, queue: str) -> list[ItemOut]:
    """Every live item of a queue, page by page, without leasing."""
    got: list[ItemOut] = []
    after: str | None = None
    async with Client(url) as c:
        while True:
            page = await c.list_items(queue, limit=1000, start_after=after)
            got.extend(page.items)
            after = page.next_start_after
            if after is None:
                return got


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Node:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextmanager
def okq_node(
    store: str,
    tmp: Path,
    *,
    endpoint_url: str | None = None,
    keys: str | None = KEYS,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    port: int | None = None,
) -> Iterator[Node]:
    """``okq serve`` on a free loopback port (or ``port``), stopped on exit; ``command``
    replaces ``python -m okq.cli`` (a benchmark that starts okq's entry point its own
    way)."""
    port = port or free_port()
    args = [*(command or [sys.executable, "-m", "okq.cli"]), "serve", "--store", store,
            "--port", str(port), "--log-level", "WARNING", *(extra or [])]
    if endpoint_url:
        args += ["--endpoint-url", endpoint_url]
    full_env = {**os.environ, **(env or {})}
    if keys is not None:
        full_env["OKQ_SIGNING_KEYS"] = keys
    log = tmp / f"node-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    node = Node(proc, f"http://127.0.0.1:{port}", log)
    try:
        _wait_healthy(node)
        yield node
    finally:
        node.stop()


#: A node starts in about a second; under the suite's parallel load, on a 2-core machine
#: shared with other work, it once took over 30 s.
def _wait_healthy(node: Node, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"okq serve exited with {node.proc.returncode}:\n{node.output()}")
        try:
            with urllib.request.urlopen(f"{node.url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    node.stop(signal.SIGKILL)
    raise RuntimeError(f"okq serve did not become healthy:\n{node.output()}")
