"""The CLI tests' fixtures: each test file runs against its own ``okq serve`` node
(the files run side by side on the suite's workers), and ends by checking that
node's log and every output of the CLI for tracebacks (``test_no_traceback_in_any_output``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.acceptance.cli import support
from tests.acceptance.cli.support import Cli
from tests.nodes import Node, okq_node


@pytest.fixture(autouse=True)
def _note_xfail(request: pytest.FixtureRequest) -> Iterator[None]:
    """The outputs of xfail tests (which pin crashes) stay out of the traceback check."""
    support.IN_XFAIL[0] = request.node.get_closest_marker("xfail") is not None
    yield
    support.IN_XFAIL[0] = False


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("cli-node")
    with okq_node(f"file://{tmp / 'data'}", tmp) as n:
        yield n


@pytest.fixture(scope="module")
def cli(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(node.url, tmp_path_factory.mktemp("cli"))
