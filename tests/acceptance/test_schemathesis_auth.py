"""Schemathesis against a node that requires API keys: no request may be a 5xx.

The same CLI run as tests/acceptance/test_schemathesis.py (its node, its checks),
on a node started with ``--api-keys``, every request sent with ``-H
"Authorization: Bearer KEY"``: once with the operator key (admin: every operation
runs, keys.create/list/delete included), once with a read-only key (most
operations are refused, 403, before their body is read). Fewer examples than the
open run, to stay within a minute for both.
"""

from __future__ import annotations

import json
import re
import secrets
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from okq.server.routes import ROUTES
from tests.acceptance.test_schemathesis import QUEUES, assert_no_server_error, run_schemathesis
from tests.nodes import Node, okq_node

OPERATOR = f"operator-{secrets.token_urlsafe(24)}"
BUDGET = 90  # seconds for one run (the subprocess's timeout)
OPERATIONS = len(ROUTES) + 2  # the /v1 endpoints, /health and /metrics
READS = 6  # queue.stats, queues.list, queues.info, items.list, auth.whoami, fleet.status


def post(url: str, path: str, body: dict[str, object], key: str) -> dict[str, object]:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        result: dict[str, object] = json.loads(resp.read())
        return result


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("schemathesis-auth")
    extra = ["--max-wait", "1", "--api-keys", OPERATOR]
    with okq_node(f"file://{tmp / 'store'}", tmp, extra=extra) as n:
        for name in QUEUES:
            post(n.url, "/v1/queues.create", {"name": name}, OPERATOR)
            post(n.url, "/v1/queue.produce",
                 {"queue_name": name, "items": [{"utf8": f"{name} {i}"} for i in range(20)]},
                 OPERATOR)
        post(n.url, "/v1/queue.lease", {"queue_name": "q", "batch_size": 2}, OPERATOR)
        yield n


def run_with_key(node: Node, workdir: Path, key: str, examples: int) -> tuple[int, str, int]:
    """The same CLI run as the open one, with ``key`` on every request."""
    return run_schemathesis(node, workdir, examples=examples, key=key, budget=BUDGET)


def _statuses(node: Node) -> dict[str, int]:
    """Answers so far by status, from the node's metrics."""
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, int] = {}
    for m in re.finditer(r'^okq_http_requests_total\{[^}]*status="(\d+)"[^}]*\} (\S+)$', text,
                         re.MULTILINE):
        out[m[1]] = out.get(m[1], 0) + int(float(m[2]))
    return out


def test_no_server_errors_with_the_operator_key(node: Node, tmp_path: Path) -> None:
    before = _statuses(node)
    code, output, cases = run_with_key(node, tmp_path, OPERATOR, examples=6)
    assert cases >= 6 * OPERATIONS // 2, "too few test cases: did operations get skipped?"
    assert_no_server_error(node, code, output)
    after = _statuses(node)
    # The key opened the API: most answers were not 401, and some succeeded.
    assert after.get("401", 0) == before.get("401", 0), after
    assert after.get("200", 0) - before.get("200", 0) > OPERATIONS, after


def test_no_server_errors_with_a_read_only_key(node: Node, tmp_path: Path) -> None:
    made = post(node.url, "/v1/keys.create", {"role": "read-only", "name": "schemathesis"},
                OPERATOR)
    before = _statuses(node)
    code, output, cases = run_with_key(node, tmp_path, str(made["key"]), examples=4)
    assert cases >= 4 * OPERATIONS // 2, "too few test cases: did operations get skipped?"
    assert_no_server_error(node, code, output)
    after = _statuses(node)
    assert after.get("403", 0) > before.get("403", 0), after  # the writes were refused
    # Every write is refused; a read may be too, when every example of it named
    # another namespace in X-Okq-Namespace (a read-only key acts in its own only).
    refused = re.search(r"(\d+) operations returned only 401/403", output)
    assert refused and len(ROUTES) - READS <= int(refused[1]) <= len(ROUTES), output[-3000:]
    assert after.get("200", 0) > before.get("200", 0), after  # and the reads answered
