"""The okq command line's start-up: a command loads only what it uses (okq/cli.py,
okq.commands.LazyGroup), since the suite and scripts start it hundreds of times."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules a command that does not need them must not load: the engine, the node,
#: the HTTP stack, the request models, the node's settings.
HEAVY = ("okq.engine", "okq.server", "okq.settings", "okq.client", "okq.wire", "aiohttp",
         "pydantic", "pydantic_settings")

PROBE = """
import json, sys
from okq.cli import main
try:
    main(sys.argv[1:], prog_name="okq")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_by(*args: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``okq ARGS``."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                          text=True, timeout=60, check=True)
    return set(json.loads(done.stderr.splitlines()[-1]))


@pytest.mark.parametrize("args", [["--help"], ["stats", "--help"], ["produce", "--help"]])
def test_help_loads_neither_node_nor_client(args: list[str]) -> None:
    heavy = {m for m in loaded_by(*args)
             if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))}
    assert not heavy, sorted(heavy)


def test_serve_help_loads_the_settings_not_the_server() -> None:
    loaded = loaded_by("serve", "--help")
    assert "okq.settings" in loaded
    assert not {m for m in loaded if m.startswith("okq.server")}, "the node is loaded"


def test_the_client_loads_no_node_parts() -> None:
    """``okq.client`` is what a producer or a worker imports: the node's hot path,
    its stored-object models and its engine stay out (each import costs every
    client process start-up time and memory)."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys, okq.client; "
         "print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    node = {m for m in loaded if m in ("okq.leases", "okq.tokens", "okq.model", "okq.engine",
                                       "okq.server", "okq.native")
            or m.startswith(("okq._compiled", "okq._pure", "okq.server."))}
    assert not node, sorted(node)
