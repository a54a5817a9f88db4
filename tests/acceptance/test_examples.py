"""Every program in examples/ runs as its README says, against one real node.

Each test runs an example the way a user would (a subprocess, its own working
folder, settings from the environment) and checks what it printed: an example
that stops working fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nodes import Node, free_port
from tests.sqs_support import ACCESS_KEY, SECRET_KEY, sqs_node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One node for the module, on a file store, with the SQS API's test key."""
    tmp = tmp_path_factory.mktemp("examples")
    with sqs_node(f"file://{tmp / 'data'}", tmp) as started:
        yield started


def env_for(node: Node, tmp: Path) -> dict[str, str]:
    """A user's shell: this venv's commands first on PATH, the node's URL and keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OKQ_"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        OKQ_URL=node.url,
        OKQ_SQS_ENDPOINT=node.url.removeprefix("http://"),
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def run(args: list[str], env: dict[str, str], cwd: Path,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_library_mode(tmp_path: Path) -> None:
    done = run([sys.executable, str(EXAMPLES / "library_mode.py")], dict(os.environ), tmp_path)
    assert "sent to ada@example.com (attempt 1)" in done.stdout
    assert "completed 3, dead-lettered 1: 'not-an-address'" in done.stdout


def test_library_mode_on_a_file_store_keeps_its_queues(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'data'}"
    run([sys.executable, str(EXAMPLES / "library_mode.py"), store], dict(os.environ), tmp_path)
    done = run([sys.executable, str(EXAMPLES / "library_mode.py"), store], dict(os.environ),
               tmp_path)  # the queues exist already: exist_ok keeps them
    assert "completed 3, dead-lettered 1" in done.stdout
    assert (tmp_path / "data").is_dir()


def test_shell_pipeline(node: Node, tmp_path: Path) -> None:
    done = run(["bash", str(EXAMPLES / "shell_pipeline.sh")], env_for(node, tmp_path), tmp_path)
    checked, dead = done.stdout.split("dead letters:")
    assert "ok 5" in checked and "ok 15" in checked, done.stdout
    assert "too long: 33" in dead, done.stdout
    assert "ok 33" not in done.stdout


def test_celery_app(node: Node, tmp_path: Path) -> None:
    env = {**env_for(node, tmp_path), "CELERY_RESULTS": str(tmp_path / "results")}
    folder = EXAMPLES / "celery_app"
    worker = subprocess.Popen(
        [str(BIN / "celery"), "-A", "tasks", "worker", "--pool=solo", "-Q", "okq-celery-example",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        done = run([sys.executable, "send.py"], env, folder, timeout=90)
    finally:
        worker.terminate()
        log, _ = worker.communicate(timeout=30)
    assert "word counts: [1, 2, 3]" in done.stdout, log
    # flaky_square returns only when Celery retries it: its first try always raises
    assert "squares: [1, 4, 9]" in done.stdout, log


def test_fastapi_service_and_its_worker(node: Node, tmp_path: Path) -> None:
    env = env_for(node, tmp_path)
    folder = EXAMPLES / "fastapi_service"
    port = free_port()
    service = subprocess.Popen(
        [str(BIN / "uvicorn"), "service:app", "--port", str(port), "--log-level", "warning"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        answers = [post_json(f"http://127.0.0.1:{port}/orders", body, headers, service)
                   for body, headers in [({"sku": "book-42", "quantity": 2}, {"x-tenant": "acme"}),
                                         ({"sku": "pen", "quantity": 9},
                                          {"x-tenant": "globex", "x-trace-id": "t-123"})]]
        refused = post_json(f"http://127.0.0.1:{port}/orders", {"sku": "", "quantity": 1}, {},
                            service, expect=422)
    finally:
        service.terminate()
        log, _ = service.communicate(timeout=30)
    assert all(status == 202 for status, _ in answers), (answers, log)
    assert answers[1][1]["trace_id"] == "t-123"
    assert refused[1]["detail"][0]["loc"] == ["body", "sku"]

    done = run([sys.executable, "worker.py", "--limit", "2"], env, folder, timeout=60)
    trace = answers[0][1]["trace_id"]
    assert f"shipped 2 x book-42 for acme (trace {trace})" in done.stdout
    assert "shipped 9 x pen for globex (trace t-123)" in done.stdout
    assert "done: 2 shipped, 0 dead-lettered" in done.stdout


def post_json(url: str, body: dict[str, object], headers: dict[str, str],
              service: subprocess.Popen[str], expect: int = 202) -> tuple[int, Any]:
    """POST ``body`` once the service answers (it starts in a second or so)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            assert exc.code == expect, exc.read()
            return exc.code, json.loads(exc.read())
        except urllib.error.URLError:
            if service.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_users_own_suite_with_the_pytest_plugin(tmp_path: Path) -> None:
    """examples/user_tests runs as its own project would: pytest in its folder, the
    plugin found by its entry point (this venv has okq installed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OKQ_"))}
    done = run([str(BIN / "pytest"), "-p", "no:cacheprovider", "-q"], env,
               EXAMPLES / "user_tests")
    assert "4 passed" in done.stdout, done.stdout
