"""Schemathesis against a real ``okq serve`` node: no request may be a 5xx.

The CLI runs as a subprocess (``python -m schemathesis.cli run``) on the node's
own ``/openapi.json``, with ``--url`` pinned to the loopback node, proxies
unset, a fixed seed, 8 examples per operation (``OKQ_SCHEMATHESIS_EXAMPLES``) and only the
``not_a_server_error`` check (other checks flag the schema's looseness, not
server faults). The run prints how many test cases it generated, for quoting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodes import Node, okq_node

#: Per operation and phase; OKQ_SCHEMATHESIS_EXAMPLES=200 for a longer run.
EXAMPLES = int(os.environ.get("OKQ_SCHEMATHESIS_EXAMPLES", "8"))
SEED = 20240917  # fixed: a failure reproduces with the same command
BUDGET = 150  # seconds for one run, well under the suite's 300 s timeout
QUEUES = ("0", "A", "q")  # "0" and "A" are what generators try first


def post(url: str, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        result: dict[str, object] = json.loads(resp.read())
        return result


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    # --max-wait 1: a generated long poll on an empty queue costs a second, not 15 minutes.
    with okq_node(f"file://{tmp / 'store'}", tmp, extra=["--max-wait", "1"]) as n:
        assert n.url.startswith("http://127.0.0.1:")
        for name in QUEUES:
            post(n.url, "/v1/queues.create", {"name": name})
            post(n.url, "/v1/queue.produce",
                 {"queue_name": name, "items": [{"utf8": f"{name} {i}"} for i in range(20)]})
        post(n.url, "/v1/queue.lease", {"queue_name": "q", "batch_size": 2})
        yield n


def run_schemathesis(node: Node, workdir: Path, *select: str, examples: int = EXAMPLES,
                     key: str | None = None, budget: float = BUDGET) -> tuple[int, str, int]:
    """Run the CLI (with ``key`` on every request, if given); returns (exit code,
    output, test cases generated)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "--no-color", "run",
        f"{node.url}/openapi.json", "--url", node.url,
        *(["--header", f"Authorization: Bearer {key}"] if key else []),
        "--checks", "not_a_server_error",
        # one worker: four threads took 60 % more CPU for the same cases, no sooner
        "--max-examples", str(examples), "--seed", str(SEED), "--workers", "1",
        "--request-timeout", "20", "--generation-database", "none",
        *select,
    ]
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=budget, check=False)
    seconds = time.monotonic() - began
    output = proc.stdout + proc.stderr
    found = re.search(r"^\s*(\d+) generated", output, re.MULTILINE)
    cases = int(found.group(1)) if found else -1
    scope = " ".join(select) or "all operations"
    scope += ", with a key" if key else ""
    print(f"\nschemathesis ({scope}): {cases} test cases in {seconds:.1f}s, "
          f"exit code {proc.returncode}")
    summary = output[output.find("SUMMARY"):] if "SUMMARY" in output else output[-3000:]
    print(summary)
    assert cases > 0, f"cannot find the test case count in the output:\n{output[-3000:]}"
    return proc.returncode, output, cases


def assert_no_server_error(node: Node, code: int, output: str) -> None:
    server_errors = re.findall(r"\[5\d\d\][^\n]*", output)
    assert code == 0 and not server_errors, (
        f"schemathesis exit code {code}; server errors: {server_errors}\n{output[-6000:]}\n"
        f"node log:\n{node.output()[-4000:]}"
    )
    assert "ST101" not in output


def test_no_server_errors(node: Node, tmp_path: Path) -> None:
    code, output, cases = run_schemathesis(node, tmp_path)
    assert cases >= EXAMPLES * 10, "too few test cases: did operations get skipped?"
    assert_no_server_error(node, code, output)
