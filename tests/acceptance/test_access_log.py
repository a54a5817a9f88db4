"""aiohttp's access log, a line per HTTP request: off unless ``--access-log``,
at the default log level too (a line costs about a fifth of a small lease)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.nodes import okq_node


@pytest.mark.parametrize("flag", [None, "--access-log", "--no-access-log"])
def test_a_line_per_request_only_when_asked(flag: str | None, tmp_path: Path) -> None:
    extra = ["--log-level", "INFO", *([flag] if flag else [])]
    with okq_node("memory://", tmp_path, extra=extra) as n:
        for _ in range(3):
            with urllib.request.urlopen(f"{n.url}/health?probe=access-log", timeout=10) as r:
                assert r.status == 200
        n.stop()
    lines = [line for line in n.output().splitlines()
             if "aiohttp.access" in line and "probe=access-log" in line]
    assert len(lines) == (3 if flag == "--access-log" else 0), n.output()[-3000:]
    assert "okq listening on" in n.output()  # INFO lines are there: only the access log is off
