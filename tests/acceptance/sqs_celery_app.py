"""The Celery app of tests/acceptance/test_sqs_clients.py: a real worker imports it
(``celery -A tests.acceptance.sqs_celery_app -b sqs://... worker``) and the test
process builds the same app with :func:`make_app` to send tasks.

Nothing here is okq-specific: it is the configuration a Celery user on Amazon SQS
writes, with only the broker URL (given by ``-b``) pointing at an okq node. There is
no result backend; each task leaves files in the directory named by
``OKQ_TEST_CELERY_RECORDS`` and the test reads them.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery, Task
from celery.signals import task_received

#: Names the directory the tasks record into (set in the worker's environment).
RECORDS_ENV = "OKQ_TEST_CELERY_RECORDS"
#: SQS visibility timeout of the queues Celery creates: a killed worker's task is
#: redelivered this many seconds after it was received.
VISIBILITY_TIMEOUT = 8


def transport_options() -> dict[str, Any]:
    """Kombu's SQS transport options: plain HTTP on loopback, short timeouts so the
    tests wait seconds, not the defaults' minutes."""
    return {
        "region": "us-east-1",
        "is_secure": False,
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "wait_time_seconds": 1,
        "polling_interval": 0.2,
    }


def make_app(broker_url: str | None = None) -> Celery:
    """The app with its tasks; ``broker_url`` None leaves it to ``celery -b``."""
    app = Celery("okq_sqs_test", broker=broker_url, set_as_current=False)
    app.conf.update(
        broker_transport_options=transport_options(),
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
    )
    _register_tasks(app)
    return app


def record(name: str, text: str = "") -> None:
    """Leave one file ``<name>.<random>`` holding ``text`` in the records directory:
    one file per event, so an event recorded twice shows as two files."""
    directory = Path(os.environ[RECORDS_ENV])
    (directory / f"{name}.{uuid.uuid4().hex}").write_text(text)


def _recorded(directory: Path, name: str) -> list[Path]:
    return sorted(directory.glob(f"{name}.*"), key=lambda p: p.stat().st_mtime_ns)


def records(directory: Path, name: str) -> list[str]:
    """The texts recorded under ``name``, oldest first."""
    return [p.read_text() for p in _recorded(directory, name)]


def record_times(directory: Path, name: str) -> list[float]:
    """When each record under ``name`` was written (epoch seconds), oldest first."""
    return [p.stat().st_mtime for p in _recorded(directory, name)]


def record_once(tag: str) -> None:
    record(f"record-{tag}")


def flaky(task: Task, tag: str, failures: int) -> None:
    """Fail ``failures`` times, each time asking Celery to retry one second later."""
    attempt = task.request.retries
    record(f"flaky-{tag}-try", str(attempt))
    if attempt < failures:
        raise task.retry(exc=RuntimeError(f"attempt {attempt} fails"), countdown=1,
                         max_retries=2)
    record(f"flaky-{tag}-done", str(attempt))


def slow(tag: str, seconds: float) -> None:
    """Record the start, then sleep on the first run only (the run the test kills)."""
    first = not list(Path(os.environ[RECORDS_ENV]).glob(f"slow-{tag}-start.*"))
    record(f"slow-{tag}-start", str(os.getpid()))
    if first:
        time.sleep(seconds)
    record(f"slow-{tag}-done", str(os.getpid()))


def _register_tasks(app: Celery) -> None:
    """Register the tasks under fixed names, so the test's app and the worker's agree
    (not shared: each app has its own)."""
    app.task(name="okq_test.record", shared=False)(record_once)
    app.task(name="okq_test.flaky", bind=True, shared=False)(flaky)
    app.task(name="okq_test.slow", shared=False)(slow)


def _note_receive_count(request: Any, **_: Any) -> None:
    """Record the SQS ``ApproximateReceiveCount`` kombu fetched with each message."""
    if RECORDS_ENV not in os.environ:
        return
    sqs_message = request.message.delivery_info.get("sqs_message") or {}
    count = sqs_message.get("Attributes", {}).get("ApproximateReceiveCount", "")
    record(f"received-{request.id}", str(count))


task_received.connect(_note_receive_count, weak=False)
app = make_app()
