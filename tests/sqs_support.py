"""okq nodes with the SQS API on, and boto3 clients for them, for the SQS tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.nodes import Node, okq_node

ACCESS_KEY = "AKIDOKQTEST"
SECRET_KEY = "okq-test-secret-0123456789"
REGION = "us-east-1"
#: The node's --sqs-keys: one key in the node's namespace (``default``).
SQS_KEYS = f"{ACCESS_KEY}:{SECRET_KEY}"
#: What every AWS client process needs so that nothing leaves loopback or reads a
#: user's configuration.
AWS_ENV = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}


#: The stores the SQS tests run on: a node's file store and SeaweedFS.
STORES = ["file", pytest.param("seaweed", marks=pytest.mark.s3)]


@contextmanager
def sqs_node_on(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Node]:
    """``sqs_node`` on the store ``request.param`` names (one of :data:`STORES`)."""
    if request.param == "file":
        store, endpoint = f"file://{tmp / 'data'}", None
    else:
        store = f"s3://okq-test/{uuid.uuid4().hex}"
        endpoint = request.getfixturevalue("seaweed_endpoint")
    with sqs_node(store, tmp, endpoint_url=endpoint) as node:
        yield node


@contextmanager
def sqs_node(store: str, tmp: Path, *, endpoint_url: str | None = None,
             extra: list[str] | None = None, keys: str = SQS_KEYS) -> Iterator[Node]:
    """``okq serve`` with the SQS API answering ``keys``."""
    with okq_node(store, tmp, endpoint_url=endpoint_url,
                  extra=["--sqs-keys", keys, *(extra or [])]) as node:
        yield node


def sqs_client(node: Node | Any, *, access_key: str = ACCESS_KEY, secret: str = SECRET_KEY,
               **config: Any) -> Any:
    """An unmodified boto3 SQS client for ``node`` (anything with a ``url``, or a URL):
    only its endpoint and keys are set."""
    from botocore.config import Config

    url = node if isinstance(node, str) else node.url
    return boto3.client("sqs", endpoint_url=url, region_name=REGION,
                        aws_access_key_id=access_key, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 1}, **config))
