"""Error paths: one-line messages (or click's usage error, exit 2), never a
traceback; API keys; payloads and errors shown verbatim in tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.cli.support import (
    Cli,
    check_no_traceback,
    live,
    make_queue,
    record,
    rows,
    stats,
)
from tests.nodes import Node, free_port, okq_node

# -- errors ----------------------------------------------------------------------------------


def test_error_unknown_queue(cli: Cli, tmp_path: Path) -> None:
    make_queue(cli.url, "uq")
    expected = "error: queue 'nope' does not exist"
    cli.many_fail([(args, 1, expected) for args in [
        ("stats", "nope"), ("produce", "nope", "x"), ("lease", "nope"), ("items", "nope"),
        ("dead", "list", "nope"), ("export", "nope", str(tmp_path / "nope.jsonl")),
        ("work", "-q", "nope", "--", "cat"), ("work", "-q", "uq", "-Q", "nope", "--", "cat"),
    ]])
    assert not (tmp_path / "nope.jsonl").exists()


def test_error_unreachable_node(cli: Cli) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    cli.many_fail([(args, 1, f"error: cannot reach okq at {closed}") for args in
                   (("stats", "q"), ("produce", "q", "x"), ("queues", "list"))], url=closed)


def test_error_message_is_one_line_in_a_pipe(cli: Cli) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    run = cli("stats", "q", url=closed, columns=None)  # no COLUMNS, as in a pipe or CI log
    assert run.rc == 1
    assert len(run.err.strip().splitlines()) == 1, run.err


def test_error_bad_flag_values(cli: Cli) -> None:
    make_queue(cli.url, "bf", "untouched")
    cli.many_fail([
        (("lease", "bf", "-n", "abc"), 2, "'abc' is not a valid integer"),
        (("lease", "bf", "-n", "0"), 1, "batch_size"),
        (("lease", "bf", "-n", "5000"), 1, "batch_size"),
        (("lease", "bf", "--lease-timeout", "0"), 1, "lease_timeout"),
        (("lease", "bf", "--wait", "soon"), 2, "'soon' is not a valid float"),
        (("-o", "xml", "stats", "bf"), 2, "'xml' is not one of"),
        (("queues", "update", "bf", "--max-attempts", "-1"), 1, "max_attempts"),
        (("queues", "create", "bf2", "--retention", "0"), 1, "retention"),
        (("work", "-q", "bf", "-j", "0", "--", "cat"), 2, "--concurrency"),
        (("work", "-q", "bf", "-c", "cat", "--", "cat"), 2, "not both"),
        (("stats", "bf", "--bogus"), 2, "No such option"),
        (("--timeout", "x", "stats", "bf"), 2, "'x' is not a valid float"),
    ])
    st = stats(cli.url, "bf")
    assert (st.available, st.in_flight) == (1, 0)  # nothing leased by the refused calls


def test_error_bad_at_time(cli: Cli) -> None:
    make_queue(cli.url, "bt")
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("produce", "bt", "--at", value, "x"), 2,
         f"Invalid value for --at: '{value}' is not an RFC 3339 time or +SECONDS")
        for value in ("tomorrow", "+soon", "2024-13-45", "+nan")]
    cases.append((("retry", "bt", "some-token", "--at", "noon"), 2,
                  "Invalid value for --at: 'noon' is not an RFC 3339 time or +SECONDS"))
    cli.many_fail(cases)
    assert live(cli.url, "bt") == []


@pytest.mark.parametrize("args", [("--at", "9999-01-01T00:00:00Z"), ("--at", "1900-01-01"),
                                  ("--key", "k" * 300)], ids=["at-9999", "at-1900", "key"])
def test_error_out_of_range_item_fields_are_one_line(cli: Cli, args: tuple[str, str]) -> None:
    cli("queues", "create", "bt-range")
    code = 2 if args[0] == "--at" else 1  # --at is checked by the CLI as a bad flag value
    msg = cli.fails("produce", "bt-range", *args, "x", code=code)
    assert args[0].lstrip("-") in msg


@pytest.mark.parametrize("value", ["+inf", "+1e20"])
def test_error_at_out_of_range(cli: Cli, value: str) -> None:
    make_queue(cli.url, f"ao{len(value)}")
    msg = cli.fails("produce", f"ao{len(value)}", "--at", value, "x", code=2)
    assert "--at" in msg


def test_error_malformed_jsonl_names_the_line(cli: Cli) -> None:
    make_queue(cli.url, "mj")
    cases = {
        '{"utf8": "ok"}\n{not json\n': "line 2: not JSON",
        '{"utf8": "ok"}\n\n[1, 2]\n': "line 3: expected an object or a string",
        '{"bytes": "!!not base64"}\n': "line 1: bytes: Value error, must be base64",
        '{"utf8": "a", "bytes": "AA=="}\n': "line 1: ",
        '{"utf8": "x", "enqueue_at": "when?"}\n': "line 1: enqueue_at: ",
        '{"utf8": "x", "key": ""}\n': "line 1: key: ",
    }
    runs: list[tuple[tuple[str, ...], int, str]] = []
    for n, (body, fragment) in enumerate(cases.items()):
        path = cli.tmp / f"bad-{n}.jsonl"
        path.write_text(body)
        runs.append((("produce", "mj", "--file", str(path)), 1, fragment))
    runs.append((("import", "mj", str(cli.tmp / "bad-0.jsonl")), 1, "line 2: not JSON"))
    cli.many_fail(runs)
    assert live(cli.url, "mj") == []  # nothing produced from the bad files


def test_error_malformed_jsonl_late_in_the_file_produces_nothing(cli: Cli) -> None:
    make_queue(cli.url, "mj-late")
    path = cli.tmp / "late.jsonl"
    path.write_text("".join(json.dumps({"utf8": f"n{n}"}) + "\n" for n in range(700))
                    + "{oops\n")
    msg = cli.fails("produce", "mj-late", "--file", str(path))
    assert "line 701" in msg
    assert live(cli.url, "mj-late") == [] or "500" in msg


def test_error_missing_file(cli: Cli, tmp_path: Path) -> None:
    make_queue(cli.url, "mf", "x")
    missing = tmp_path / "no-such-file.txt"
    cli.many_fail([
        (("produce", "mf", "--file", str(missing)), 1,
         f"No such file or directory: '{missing}'"),
        (("import", "mf", str(missing)), 2, "does not exist"),
        (("produce", "mf", "--file", str(tmp_path)), 1, "Is a directory"),
        (("export", "mf", str(tmp_path / "no-dir" / "out.jsonl")), 1,
         "No such file or directory"),
    ])


def test_error_missing_file_with_brackets_in_its_name(cli: Cli, tmp_path: Path) -> None:
    make_queue(cli.url, "mf-b")
    missing = tmp_path / "[/x] report.txt"
    msg = cli.fails("produce", "mf-b", "--file", str(missing))
    assert str(missing) in msg


def test_error_stale_and_forged_tokens(cli: Cli) -> None:
    make_queue(cli.url, "tk", "a", "b")
    [first] = cli.js("lease", "tk")
    cli.ok("retry", "tk", first["token"])  # released: the token is stale
    [second] = cli.js("lease", "tk", "-n", "1")
    head, _, sig = second["token"].rpartition(".")
    forged = f"{head}.{'A' if sig[0] != 'A' else 'B'}{sig[1:]}"
    cli.many_fail([
        (("complete", "tk", first["token"]), 1, "the lease was lost"),
        (("retry", "tk", first["token"]), 1, "the lease was lost"),
        (("complete", "tk", forged), 1, "tokens[0] has a bad signature"),
        (("complete", "tk", "garbage"), 1, "tokens[0] is not an okq lease token"),
        (("retry", "tk", forged, "--dead"), 1, "bad signature"),
    ])
    assert cli.js("complete", "tk", second["token"])["completed"] == 1
    st = stats(cli.url, "tk")
    assert (st.completed, st.in_flight) == (1, 0)


def test_api_key_required(cli: Cli, tmp_path: Path) -> None:
    with okq_node(f"file://{tmp_path / 'keyed'}", tmp_path, extra=["--api-keys", "k1,k2"]
                  ) as keyed:
        try:
            need = "error: a valid API key is required"
            cli.many_fail([(("queues", "list"), 1, need),
                           (("--api-key", "wrong", "queues", "create", "ak"), 1, need)],
                          url=keyed.url)
            cli.many_fail([(("produce", "ak", "x"), 1, need)], url=keyed.url,
                          env={"OKQ_API_KEY": "nope"})
            cli.ok("--api-key", "k1", "queues", "create", "ak", url=keyed.url)
            cli.ok("produce", "ak", "x", url=keyed.url, env={"OKQ_API_KEY": "k2"})
            got = cli.js("--api-key", "k2", "lease", "ak", url=keyed.url)
            assert [i["utf8"] for i in got] == ["x"]
            st = cli.js("stats", "ak", url=keyed.url, env={"OKQ_API_KEY": "k1"})
            assert st[0]["in_flight"] == 1
        finally:
            record(keyed.output())
            assert "Traceback" not in keyed.output()


# -- payloads are shown as they are ---------------------------------------------------------


def test_lease_shows_a_payload_with_brackets(cli: Cli) -> None:
    make_queue(cli.url, "mk-lease", "[/x] closing tag")
    run = cli("lease", "mk-lease")
    assert run.rc == 0 and "[/x] closing tag" in run.out


def test_tables_show_payloads_and_errors_verbatim(cli: Cli) -> None:
    make_queue(cli.url, "mk-dlq")
    make_queue(cli.url, "mk", "[bold]hi[/bold]", "list[x]", dead_queue="mk-dlq")
    table = rows(cli.ok("items", "mk").out)
    [leased] = cli.js("lease", "mk")
    cli.ok("retry", "mk", leased["token"], "--dead", "--error", "bad value [x]")
    dead = rows(cli.ok("dead", "list", "mk-dlq").out)
    assert [r[4] for r in table] == ["[bold]hi[/bold]", "list[x]"]
    assert dead[0][5] == "bad value [x]"


# -- last ------------------------------------------------------------------------------------


def test_no_traceback_in_any_output(node: Node) -> None:
    check_no_traceback(node)
