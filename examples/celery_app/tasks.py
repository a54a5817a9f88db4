"""A Celery app whose broker is okq's SQS API: what a Celery user on Amazon SQS
writes, with the endpoint pointed at an okq node.

    okq serve --sqs-keys "AKIAOKQEXAMPLE:a-long-random-secret"        # a node
    cd examples/celery_app
    celery -A tasks worker --pool=solo -Q okq-celery-example          # a worker
    python send.py                                                    # send tasks

Settings (environment): OKQ_SQS_ENDPOINT (default 127.0.0.1:7878), the key pair
in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and CELERY_RESULTS (a folder,
default ./celery-results) for Celery's file-system result backend, so that
``send.py`` can wait for the results without another server.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from celery import Celery

QUEUE = "okq-celery-example"


def broker_url() -> str:
    key = quote(os.environ.get("AWS_ACCESS_KEY_ID", "AKIAOKQEXAMPLE"), safe="")
    secret = quote(os.environ.get("AWS_SECRET_ACCESS_KEY", "a-long-random-secret"), safe="")
    return f"sqs://{key}:{secret}@{os.environ.get('OKQ_SQS_ENDPOINT', '127.0.0.1:7878')}"


results = os.path.abspath(os.environ.get("CELERY_RESULTS", "celery-results"))
os.makedirs(results, exist_ok=True)

app = Celery("tasks", broker=broker_url(), backend=f"file://{results}")
app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,  # plain HTTP to the node; drop this behind TLS
        "visibility_timeout": 60,
        "wait_time_seconds": 5,  # long polling
    },
    task_default_queue=QUEUE,
    task_acks_late=True,  # a task killed mid-way is delivered again
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


@app.task
def word_count(text: str) -> int:
    return len(text.split())


@app.task(bind=True, max_retries=3, default_retry_delay=0.2)
def flaky_square(self, n: int) -> int:
    """Fails on its first try, as a call to a busy service might; Celery retries it."""
    if self.request.retries == 0:
        raise self.retry(exc=RuntimeError("service busy"))
    return n * n
