"""okq nodes with the SQS API on, and boto3 clients for them, for the SQS tests."""

from __future__ import annotations

import json
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


#: The stores the SQS tests run on: a node's file store, its queues of one partition,
#: and SeaweedFS, its queues of three (``--default-partitions 3``, okq.partitions): each
#: test runs on an unpartitioned queue and on a partitioned one, on two stores.
STORES = ["file", pytest.param("seaweed-partitioned", marks=pytest.mark.s3)]
PARTITIONED = ["--default-partitions", "3"]


@contextmanager
def sqs_node_on(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Node]:
    """``sqs_node`` on the store ``request.param`` names (one of :data:`STORES`)."""
    extra: list[str] = []
    if request.param == "file":
        store, endpoint = f"file://{tmp / 'data'}", None
    else:
        store = f"s3://okq-test/{uuid.uuid4().hex}"
        endpoint = request.getfixturevalue("seaweed_endpoint")
        extra = PARTITIONED
    with sqs_node(store, tmp, endpoint_url=endpoint, extra=extra) as node:
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
    url = node if isinstance(node, str) else node.url
    return boto3.client("sqs", endpoint_url=url, region_name=REGION,
                        aws_access_key_id=access_key, aws_secret_access_key=secret,
                        config=_config(**config))


def _config(**config: Any) -> Any:
    from botocore.config import Config

    return Config(retries={"max_attempts": 1}, **config)


# -- boto3 over the query protocol -------------------------------------------------------

#: A flattened list's member element in the query protocol, where it is not the list's
#: shape name without "List" (SQS's query model, botocore before 1.31.64).
_QUERY_MEMBERS = {"MessageSystemAttributeList": "MessageSystemAttributeName",
                  "StringList": "StringListValue", "BinaryList": "BinaryListValue"}
#: A structure member holding a flattened map or list -> its element in the query protocol.
_QUERY_ELEMENTS = {"Attributes": "Attribute", "MessageAttributes": "MessageAttribute",
                   "MessageSystemAttributes": "MessageSystemAttribute", "Tags": "Tag",
                   "tags": "Tag", "StringListValues": "StringListValue",
                   "BinaryListValues": "BinaryListValue"}


def query_model(model: dict[str, Any]) -> dict[str, Any]:
    """SQS's service model for the query protocol, from botocore's JSON-protocol model.

    botocore ships SQS's model for the JSON protocol only since 1.31.64; older SDKs
    (and the AWS SDKs that still speak it) send forms and parse XML. The query model
    differs only in serialisation traits: each output is wrapped in ``<Action>Result``,
    and flattened lists and maps name their elements (``Message``, ``Attribute`` with
    ``Name``/``Value``, ``Tag`` with ``Key``/``Value``, ...)."""
    out = json.loads(json.dumps(model))
    meta = out["metadata"]
    for key in ("jsonVersion", "targetPrefix", "awsQueryCompatible"):
        meta.pop(key, None)
    meta.update(protocol="query", protocols=["query"],
                xmlNamespace="http://queue.amazonaws.com/doc/2012-11-05/")
    for op in out["operations"].values():
        if "output" in op:
            op["output"]["resultWrapper"] = f"{op['name']}Result"
    for name, shape in out["shapes"].items():
        if shape["type"] == "list":
            shape["member"]["locationName"] = _QUERY_MEMBERS.get(name, name.removesuffix("List"))
            shape["flattened"] = True
        elif shape["type"] == "map":
            key = "Key" if name == "TagMap" else "Name"
            shape["key"]["locationName"], shape["value"]["locationName"] = key, "Value"
        for member, ref in shape.get("members", {}).items():
            if member in _QUERY_ELEMENTS:
                ref["locationName"] = _QUERY_ELEMENTS[member]
    return out


def sqs_query_client(node: Node | Any, model_dir: Path, **config: Any) -> Any:
    """A boto3 SQS client for ``node`` that speaks the query protocol (form requests,
    XML replies), as SDKs did before SQS's JSON protocol; ``model_dir`` holds its model."""
    import botocore.session

    loader = botocore.session.get_session().get_component("data_loader")
    model = loader.load_service_model("sqs", "service-2")
    where = model_dir / "sqs" / model["metadata"]["apiVersion"]
    where.mkdir(parents=True, exist_ok=True)
    (where / "service-2.json").write_text(json.dumps(query_model(model)))
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(model_dir))
    client = boto3.Session(botocore_session=session).client(
        "sqs", endpoint_url=node if isinstance(node, str) else node.url, region_name=REGION,
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        config=_config(**config))
    assert client.meta.service_model.protocol == "query"
    return client
