"""Real SQS clients, unmodified but for the endpoint and credentials, against okq's
SQS front end on real ``okq serve`` nodes (file store and SeaweedFS): the AWS CLI
(``python -m awscli``) and a real Celery worker process on kombu's SQS transport.

Every client gets the node's loopback URL, dummy credentials and
``AWS_EC2_METADATA_DISABLED=true``; AWS config files point at paths that do not
exist, so nothing from the machine's AWS setup leaks in and nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery

from tests import cliforks
from tests.acceptance import sqs_celery_app
from tests.acceptance.sqs_celery_app import RECORDS_ENV, VISIBILITY_TIMEOUT, record_times, records
from tests.sqs_support import ACCESS_KEY, REGION, SECRET_KEY, STORES, sqs_client, sqs_node_on

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sqs:
    """An SQS endpoint on loopback and the access key it accepts."""

    url: str
    akid: str
    secret: str
    tmp: Path

    def env(self, secret: str | None = None) -> dict[str, str]:
        """A subprocess environment with this endpoint's credentials and no other AWS
        setting of the machine (no profile, no config file, no instance metadata)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ACCESS_KEY_ID=self.akid,
            AWS_SECRET_ACCESS_KEY=self.secret if secret is None else secret,
            AWS_DEFAULT_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            AWS_CONFIG_FILE=str(self.tmp / "no-aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(self.tmp / "no-aws-credentials"),
        )
        return env

    def broker_url(self) -> str:
        """Celery's ``sqs://`` broker URL for this endpoint (plain HTTP: ``is_secure``
        is False in the transport options)."""
        host = self.url.removeprefix("http://")
        return f"sqs://{quote(self.akid, safe='')}:{quote(self.secret, safe='')}@{host}"


@pytest.fixture(scope="module", params=STORES)
def sqs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sqs]:
    """One okq node per store for the module, serving SQS with a test access key;
    every test works on queues of its own."""
    tmp = tmp_path_factory.mktemp(f"sqs-{request.param}")
    with sqs_node_on(request, tmp) as node:
        yield Sqs(node.url, ACCESS_KEY, SECRET_KEY, tmp)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# -- the AWS CLI --------------------------------------------------------------------


def aws(sqs: Sqs, *args: str, secret: str | None = None) -> subprocess.CompletedProcess[str]:
    """``aws sqs ARGS`` from this venv's awscli (``python -m awscli``, forked by
    tests/cliforks.py), pointed at the node."""
    return cliforks.run(["sqs", *args, "--endpoint-url", sqs.url, "--output", "json"],
                        env=sqs.env(secret), timeout=60, program="aws")


def aws_json(sqs: Sqs, *args: str) -> Any:
    """``aws sqs ARGS``, which must succeed; its JSON output (None when it printed none)."""
    done = aws(sqs, *args)
    assert done.returncode == 0, f"aws sqs {args}: {done.returncode}\n{done.stderr}"
    return json.loads(done.stdout) if done.stdout.strip() else None


def md5_of_attributes(attributes: dict[str, dict[str, str]]) -> str:
    """SQS's MD5OfMessageAttributes, computed as Amazon documents it: per attribute in
    name order, length-prefixed name, data type, a transport byte, length-prefixed
    value (only string values here)."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        attr = attributes[name]
        for part in (name, attr["DataType"]):
            digest.update(struct.pack(">I", len(part.encode())) + part.encode())
        value = attr["StringValue"].encode()
        digest.update(b"\x01" + struct.pack(">I", len(value)) + value)
    return digest.hexdigest()


def counts(sqs: Sqs, queue_url: str) -> tuple[int, int]:
    """(ApproximateNumberOfMessages, ...NotVisible) from ``get-queue-attributes All``."""
    got = aws_json(sqs, "get-queue-attributes", "--queue-url", queue_url,
                   "--attribute-names", "All")["Attributes"]
    return (int(got["ApproximateNumberOfMessages"]),
            int(got["ApproximateNumberOfMessagesNotVisible"]))


def test_aws_cli_queue_calls(sqs: Sqs) -> None:
    name = unique("cli")
    url = aws_json(sqs, "create-queue", "--queue-name", name)["QueueUrl"]
    assert url.startswith(sqs.url) and url.rstrip("/").endswith(f"/{name}")
    assert aws_json(sqs, "get-queue-url", "--queue-name", name)["QueueUrl"] == url
    listed = aws_json(sqs, "list-queues", "--queue-name-prefix", name)
    assert listed["QueueUrls"] == [url]
    attrs = aws_json(sqs, "get-queue-attributes", "--queue-url", url,
                     "--attribute-names", "All")["Attributes"]
    assert attrs["QueueArn"].endswith(f":{name}")
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesNotVisible"]) \
        == ("0", "0")


def test_aws_cli_send_receive_delete(sqs: Sqs) -> None:
    url = aws_json(sqs, "create-queue", "--queue-name", unique("cli"))["QueueUrl"]
    body = f"héllo from the aws cli {uuid.uuid4()}"
    attributes = {"kind": {"DataType": "String", "StringValue": "greeting"},
                  "count": {"DataType": "Number", "StringValue": "3"}}
    sent = aws_json(sqs, "send-message", "--queue-url", url, "--message-body", body,
                    "--message-attributes", json.dumps(attributes), "--delay-seconds", "0")
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    aws_json(sqs, "send-message", "--queue-url", url, "--message-body", "second")
    assert counts(sqs, url) == (2, 0)

    got = aws_json(sqs, "receive-message", "--queue-url", url, "--attribute-names", "All",
                   "--message-attribute-names", "All", "--wait-time-seconds", "2")
    (message,) = got["Messages"]
    assert message["Body"] == body and message["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert message["MessageId"] == sent["MessageId"]
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(message["Attributes"]["SentTimestamp"]) <= time.time() * 1000
    assert counts(sqs, url) == (1, 1)

    assert aws_json(sqs, "delete-message", "--queue-url", url,
                    "--receipt-handle", message["ReceiptHandle"]) is None
    assert counts(sqs, url) == (1, 0)


def test_aws_cli_wrong_secret_is_refused(sqs: Sqs) -> None:
    done = aws(sqs, "list-queues", secret=f"not-{sqs.secret}")
    assert done.returncode != 0
    assert "SignatureDoesNotMatch" in done.stderr, done.stderr


# -- a real Celery worker -----------------------------------------------------------


class CeleryWorker:
    """``celery worker`` as a subprocess in its own session, consuming one queue."""

    def __init__(self, sqs: Sqs, queue: str, records_dir: Path,
                 app: str = sqs_celery_app.__name__, records_env: str = RECORDS_ENV) -> None:
        self.log = records_dir.parent / f"worker-{uuid.uuid4().hex[:8]}.log"
        command = [
            sys.executable, "-m", "celery", "-A", app,
            "-b", sqs.broker_url(), "worker", "--pool=solo", "-Q", queue,
            "-n", f"{unique('w')}@localhost", "--loglevel=INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        env = {**sqs.env(), records_env: str(records_dir), "PYTHONPATH": str(REPO)}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker's whole process group, as a crash or an OOM kill would."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """A warm shutdown, then SIGKILL if it takes too long."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def wait_for(check: Callable[[], bool], what: str, worker: CeleryWorker,
             timeout: float = 30) -> None:
    """Poll ``check`` until true; fail with the worker's log on time-out or its death."""
    deadline = time.monotonic() + timeout
    while not check():
        if not worker.alive():
            pytest.fail(f"worker exited ({worker.proc.returncode}) before {what}:\n"
                        f"{worker.output()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout}s; worker log:\n{worker.output()}")
        time.sleep(0.1)


@dataclass
class CeleryRig:
    """The test's side of a Celery test: its app (to send), queue, records and workers."""

    sqs: Sqs
    app: Celery
    queue: str
    records: Path
    workers: list[CeleryWorker]

    def worker(self) -> CeleryWorker:
        worker = CeleryWorker(self.sqs, self.queue, self.records)
        self.workers.append(worker)
        return worker

    def send(self, task: str, *args: Any) -> str:
        """Send ``task`` with ``apply_async`` on the test's queue; its task id."""
        return str(self.app.tasks[task].apply_async(args, queue=self.queue).id)

    def count(self, name: str) -> int:
        return len(records(self.records, name))

    def queue_attributes(self) -> dict[str, str]:
        """The queue's attributes (``All``), read with boto3."""
        client = sqs_client(self.sqs.url)
        try:
            url = client.get_queue_url(QueueName=self.queue)["QueueUrl"]
            got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        finally:
            client.close()
        return dict(got["Attributes"])

    def queue_attribute(self, name: str) -> str:
        return self.queue_attributes()[name]

    def queue_is_empty(self) -> bool:
        """Whether the queue holds no message, visible or not: every task was
        acknowledged (kombu deletes the message after the task ran)."""
        got = self.queue_attributes()
        names = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed")
        return all(got[name] == "0" for name in names)


@pytest.fixture
def celery_rig(sqs: Sqs, tmp_path: Path) -> Iterator[CeleryRig]:
    """A queue of the test's own; every worker it started is killed at the end."""
    app = sqs_celery_app.make_app(sqs.broker_url())
    queue = unique("celery")
    app.conf.task_default_queue = queue
    (tmp_path / "records").mkdir()
    rig = CeleryRig(sqs, app, queue, tmp_path / "records", [])
    try:
        yield rig
    finally:
        for worker in rig.workers:
            worker.stop()
        app.close()


def test_celery_tasks_run_exactly_once(celery_rig: CeleryRig) -> None:
    rig = celery_rig
    task = rig.app.tasks["okq_test.record"]
    tags = [f"t{i}" for i in range(20)]
    for tag in tags[:10]:
        task.delay(tag)
    for tag in tags[10:]:
        rig.send("okq_test.record", tag)
    worker = rig.worker()
    wait_for(lambda: all(rig.count(f"record-{t}") for t in tags), "all 20 tasks", worker)
    wait_for(rig.queue_is_empty, "an empty queue", worker, timeout=10)
    assert Counter(rig.count(f"record-{t}") for t in tags) == {1: 20}


def test_celery_task_that_raises_is_retried(celery_rig: CeleryRig) -> None:
    rig = celery_rig
    worker = rig.worker()
    a = rig.send("okq_test.flaky", "a", 2)
    b = rig.send("okq_test.flaky", "b", 1)
    wait_for(lambda: rig.count("flaky-a-done") + rig.count("flaky-b-done") == 2,
             "retried tasks done", worker)
    wait_for(rig.queue_is_empty, "an empty queue", worker, timeout=10)
    assert sorted(records(rig.records, "flaky-a-try")) == ["0", "1", "2"]
    assert records(rig.records, "flaky-a-done") == ["2"]
    assert sorted(records(rig.records, "flaky-b-try")) == ["0", "1"]
    assert records(rig.records, "flaky-b-done") == ["1"]
    # Each retry is a new message through the broker, received once.
    assert records(rig.records, f"received-{a}") == ["1", "1", "1"]
    assert records(rig.records, f"received-{b}") == ["1", "1"]


def test_celery_task_of_a_killed_worker_is_redelivered(celery_rig: CeleryRig) -> None:
    rig = celery_rig
    first = rig.worker()
    task_id = rig.send("okq_test.slow", "k", 120)
    wait_for(lambda: rig.count("slow-k-start") == 1, "the slow task's start", first)
    first.kill()
    assert rig.count("slow-k-done") == 0

    second = rig.worker()
    wait_for(lambda: rig.count("slow-k-done") == 1, "the redelivered task",
             second, timeout=VISIBILITY_TIMEOUT + 30)
    wait_for(rig.queue_is_empty, "an empty queue", second, timeout=10)
    starts = records(rig.records, "slow-k-start")
    assert len(starts) == 2 and starts[1] == str(second.proc.pid), starts
    # Not before the visibility timeout kombu gave the queue (less the moments between
    # the first receive and the first start record).
    assert rig.queue_attribute("VisibilityTimeout") == str(VISIBILITY_TIMEOUT)
    first_start, second_start = record_times(rig.records, "slow-k-start")
    assert second_start - first_start > VISIBILITY_TIMEOUT - 1
    # kombu fetches SQS's ApproximateReceiveCount with every message: 1, then 2.
    assert records(rig.records, f"received-{task_id}") == ["1", "2"]
