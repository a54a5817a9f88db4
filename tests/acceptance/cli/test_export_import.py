"""``okq export`` and ``okq import`` of a 3,000-item queue: resumed after an
interruption, checkpointed, never duplicated.
"""

from __future__ import annotations

import base64
import hashlib
import json
import resource
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.cli.support import (
    OKQ,
    Cli,
    check_no_traceback,
    env_for,
    live,
    make_queue,
    payloads,
    stats,
)
from tests.nodes import Node

# -- export and import ------------------------------------------------------------------------

EXPORT_PLAIN = 2990


@pytest.fixture(scope="module")
def export_source(cli: Cli) -> dict[str, Any]:
    """Queue ``ex`` with 3,000 live items: text, binary, scheduled, one leased."""
    make_queue(cli.url, "ex")
    lines = cli.tmp / "ex-source.txt"
    lines.write_text("".join(f"plain item {n:05d}\n" for n in range(EXPORT_PLAIN)))
    cli.ok("produce", "ex", "--file", str(lines))
    later = (datetime.now(UTC) + timedelta(hours=3)).isoformat()
    extra = [{"bytes": base64.b64encode(bytes([n, 0, 255])).decode()} for n in range(5)]
    extra += [{"utf8": f"scheduled {n}", "enqueue_at": later} for n in range(5)]
    jl = cli.tmp / "ex-source.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in extra))
    cli.ok("produce", "ex", "--file", str(jl))
    cli.ok("lease", "ex", "--lease-timeout", "3600")  # a leased item is live too
    items = live(cli.url, "ex")
    assert len(items) == EXPORT_PLAIN + 10
    return {"queue": "ex", "count": len(items), "ids": [i.id for i in items],
            "payloads": payloads(items)}


@pytest.fixture(scope="module")
def exported(cli: Cli, export_source: dict[str, Any]) -> Path:
    path = cli.tmp / "ex.jsonl"
    run = cli.ok("export", "ex", str(path))
    assert run.out.strip() == f"exported {export_source['count']} items to {path}"
    return path


def export_ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_export_writes_every_live_item_once(exported: Path,
                                            export_source: dict[str, Any]) -> None:
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [r["id"] for r in records] == export_source["ids"]
    got = Counter(base64.b64decode(r["bytes"]) if "bytes" in r else r["utf8"].encode()
                  for r in records)
    assert got == export_source["payloads"]
    assert sum("enqueue_at" in r for r in records) == 5


def test_export_refuses_an_existing_file(cli: Cli, exported: Path) -> None:
    before = exported.read_bytes()
    msg = cli.fails("export", "ex", str(exported), code=2)
    assert "exists: use --resume" in msg
    assert exported.read_bytes() == before
    again = cli.js("export", "ex", str(exported), "--resume")
    assert again == {"queue_name": "ex", "exported": 0, "file": str(exported)}
    assert exported.read_bytes() == before


@pytest.mark.parametrize("cut", ["torn-line", "line-boundary", "first-line-torn"])
def test_export_resume_after_interruption(cli: Cli, exported: Path, cut: str) -> None:
    full = exported.read_bytes()
    path = cli.tmp / f"ex-{cut}.jsonl"
    if cut == "torn-line":  # killed while writing a line, 40% in
        data = full[: int(len(full) * 0.4)]
        assert not data.endswith(b"\n")
    elif cut == "line-boundary":  # killed right after a flush
        data = full[: full.index(b"\n", int(len(full) * 0.7)) + 1]
    else:  # only part of the first line was written
        data = full[:12]
    path.write_bytes(data)
    run = cli.js("export", "ex", str(path), "--resume")
    assert path.read_bytes() == full  # every live item, exactly once, in order
    assert run["exported"] == len(export_ids(exported)) - data.count(b"\n")


def test_export_resume_when_only_the_newline_is_missing(cli: Cli, exported: Path) -> None:
    full = exported.read_bytes()
    cut = full.index(b"\n", len(full) // 2)
    path = cli.tmp / "ex-no-newline.jsonl"
    path.write_bytes(full[:cut])  # the last record is whole; its "\n" never made it
    cli.ok("export", "ex", str(path), "--resume")
    assert Counter(export_ids(path)) == Counter(export_ids(exported))


def _import_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # as okq import computes it


def _checkpoint(path: Path, queue: str) -> Path:
    return path.with_name(path.name + f".okq-import-{queue}")


def _assert_imported_once(url: str, queue: str, source: dict[str, Any]) -> None:
    items = live(url, queue)
    assert len(items) == source["count"]
    assert payloads(items) == source["payloads"]
    st = stats(url, queue)
    assert (st.available, st.scheduled) == (source["count"] - 5, 5)


def test_import_then_import_again(cli: Cli, exported: Path,
                                  export_source: dict[str, Any]) -> None:
    make_queue(cli.url, "im-a")
    run = cli.ok("import", "im-a", str(exported))
    assert run.out.strip() == f"imported {export_source['count']} items"
    assert not _checkpoint(exported, "im-a").exists()
    _assert_imported_once(cli.url, "im-a", export_source)
    # a second run (checkpoint gone): the idempotency keys keep it from duplicating
    again = cli.js("import", "im-a", str(exported))
    assert again["queue_name"] == "im-a" and again["skipped"] == 0
    _assert_imported_once(cli.url, "im-a", export_source)


def _produce_lines_as_import_would(cli: Cli, exported: Path, queue: str, upto: int,
                                   keyed: bool) -> None:
    digest = _import_digest(exported)
    part = cli.tmp / f"part-{queue}.jsonl"
    with part.open("w") as fh:
        for n, line in enumerate(exported.read_text().splitlines()[:upto], 1):
            rec = json.loads(line)
            item = {k: rec[k] for k in ("utf8", "bytes", "enqueue_at") if k in rec}
            if keyed:
                item["key"] = f"import:{digest}:{n}"
            fh.write(json.dumps(item) + "\n")
    cli.ok("produce", queue, "--file", str(part))


def test_import_resumes_from_its_checkpoint(cli: Cli, exported: Path,
                                            export_source: dict[str, Any]) -> None:
    """An import killed after 1,000 lines, resumed after the keys expired: only the
    checkpoint stands between the rerun and duplicates."""
    make_queue(cli.url, "im-b")
    _produce_lines_as_import_would(cli, exported, "im-b", 1000, keyed=False)
    _checkpoint(exported, "im-b").write_text(f"{_import_digest(exported)} 1000\n")
    run = cli.ok("import", "im-b", str(exported))
    left = export_source["count"] - 1000
    assert run.out.strip() == f"imported {left} items (1000 already imported)"
    assert not _checkpoint(exported, "im-b").exists()
    _assert_imported_once(cli.url, "im-b", export_source)


def test_import_checkpoint_behind_the_produced_lines(cli: Cli, exported: Path,
                                                     export_source: dict[str, Any]) -> None:
    """Killed after producing lines up to 1,500 but before writing the checkpoint
    past 1,000: the idempotency keys absorb the 500 lines produced twice."""
    make_queue(cli.url, "im-c")
    _produce_lines_as_import_would(cli, exported, "im-c", 1500, keyed=True)
    _checkpoint(exported, "im-c").write_text(f"{_import_digest(exported)} 1000\n")
    got = cli.js("import", "im-c", str(exported))
    # the 500 lines produced before are there already: their keys say so
    assert got == {"queue_name": "im-c", "imported": export_source["count"] - 1500,
                   "duplicates": 500, "skipped": 1000}
    _assert_imported_once(cli.url, "im-c", export_source)


def test_import_ignores_a_checkpoint_of_another_file(cli: Cli, exported: Path,
                                                     export_source: dict[str, Any]) -> None:
    make_queue(cli.url, "im-d")
    _checkpoint(exported, "im-d").write_text("0123456789abcdef 2000\n")
    got = cli.js("import", "im-d", str(exported))
    assert (got["imported"], got["skipped"]) == (export_source["count"], 0)
    _assert_imported_once(cli.url, "im-d", export_source)


def _import_with_file_size_limit(url: str, queue: str, path: Path) -> int:
    """``okq import`` in a process that may write no file longer than 8 bytes, so its
    first checkpoint write fails halfway, as on a full disk; its exit code."""
    proc = subprocess.run(
        [*OKQ, "import", queue, str(path)], capture_output=True, timeout=180,
        env=env_for(url, {"PYTHONDONTWRITEBYTECODE": "1"}),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8)))
    return proc.returncode


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(
        cli: Cli, exported: Path, export_source: dict[str, Any]) -> None:
    """The checkpoint is replaced atomically: a write that fails halfway leaves the
    last one whole (truncate-then-write left it empty, and a rerun after the keys
    expired produced lines 1 to 1,000 a second time)."""
    make_queue(cli.url, "im-f")
    _produce_lines_as_import_would(cli, exported, "im-f", 1000, keyed=False)
    folder = cli.tmp / "im-f"
    folder.mkdir()
    copy = folder / exported.name
    copy.write_bytes(exported.read_bytes())
    checkpoint = _checkpoint(copy, "im-f")
    before = f"{_import_digest(copy)} 1000\n"
    checkpoint.write_text(before)
    assert _import_with_file_size_limit(cli.url, "im-f", copy) != 0
    assert checkpoint.read_text() == before
    assert sorted(p.name for p in folder.iterdir()) == sorted([copy.name, checkpoint.name])
    got = cli.js("import", "im-f", str(copy))
    assert got["skipped"] == 1000
    _assert_imported_once(cli.url, "im-f", export_source)


@pytest.mark.parametrize("torn", ["", "0123456789ab", "0123456789abcdef 1"[:17]])
def test_import_refuses_an_unreadable_checkpoint(cli: Cli, exported: Path, torn: str) -> None:
    """How far the interrupted import got is unknown: the rerun stops and says so,
    producing nothing, rather than start again from line 1."""
    queue = f"im-g{len(torn)}"
    make_queue(cli.url, queue)
    checkpoint = _checkpoint(exported, queue)
    checkpoint.write_text(torn)
    try:
        msg = cli.fails("import", queue, str(exported))
    finally:
        checkpoint.unlink(missing_ok=True)
    assert str(checkpoint) in msg and "unreadable" in msg, msg
    assert live(cli.url, queue) == []


def test_import_killed_midway_then_rerun(cli: Cli, exported: Path,
                                         export_source: dict[str, Any]) -> None:
    make_queue(cli.url, "im-e")
    checkpoint = _checkpoint(exported, "im-e")
    proc = subprocess.Popen([*OKQ, "import", "im-e", str(exported)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_for(cli.url))
    try:
        while proc.poll() is None and not checkpoint.exists():
            time.sleep(0.002)
        proc.kill()  # as soon as the first batch is checkpointed (or it already finished)
    finally:
        proc.communicate()
    interrupted = proc.returncode == -signal.SIGKILL and checkpoint.exists()
    run = cli.js("import", "im-e", str(exported))
    # a batch produced after the last checkpoint comes back as duplicates, not added twice
    assert run["imported"] + run["duplicates"] + run["skipped"] == export_source["count"]
    assert (run["skipped"] > 0) == interrupted
    _assert_imported_once(cli.url, "im-e", export_source)



def test_items_all_on_a_large_queue(cli: Cli, export_source: dict[str, Any]) -> None:
    got = cli.js("items", export_source["queue"], "--all")
    assert len(got) == export_source["count"]


# -- last ------------------------------------------------------------------------------------


def test_no_traceback_in_any_output(node: Node) -> None:
    check_no_traceback(node)
