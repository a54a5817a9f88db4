"""okq.testing, the pytest plugin, as a user's suite meets it: pytest's own
``pytester`` runs a user's test file (tests/plugin_user.py) and the examples of the
README and docs/TESTING.md against the plugin's fixtures on each store, and the
plugin stays out of the way of runs that do not use it (okq's own suite loads it
too: entry points load in every pytest run)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import okq.testing
from tests.plugin_user import FAILING_TEST, FAILURE, PASSED, PYTEST_CONFIG, USER_TESTS

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
FIXTURES = sorted(name for name in vars(okq.testing) if name.startswith("okq_"))


def first_python_block(doc: str, after: str) -> str:
    """The first python block of ``doc`` after the text ``after``: the docs' examples
    run as a user's tests do."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert after in text, f"{doc} no longer has {after!r}"
    return text.split(after, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module", autouse=True)
def _modules_the_runs_share() -> None:
    """pytester runs the user's suite in this process (a subprocess would spend seconds
    importing this environment's other plugins) and, after each run, forgets the modules
    that the run imported: okq's, moto's and boto3's are imported first, so that every
    run uses the same ones (an okq.ops of a second run would not be the engine's). Here,
    not at the top: every xdist worker imports every test module."""
    for name in ("okq.testing.node", "okq.testing.drain", "okq.store.s3", "moto.server",
                 "boto3"):
        importlib.import_module(name)


#: The examples of the README and docs/TESTING.md, each a user's test file.
EXAMPLES = {"test_readme": ("README.md", "## Testing your own code"),
            "test_guide": ("docs/TESTING.md", "## A first test")}


@pytest.mark.parametrize("kind", ["memory", "file", pytest.param("moto", marks=pytest.mark.s3)])
def test_a_users_tests_pass_on_each_store_and_a_failing_one_fails(
        pytester: pytest.Pytester, kind: str) -> None:
    """memory and moto chosen by --okq-store, file by the ini option."""
    config = PYTEST_CONFIG + (f'okq_store = "{kind}"\n' if kind == "file" else "")
    pytester.makefile(".toml", pyproject=config)
    pytester.makepyfile(test_user=USER_TESTS + FAILING_TEST, **{
        name: first_python_block(doc, after) for name, (doc, after) in EXAMPLES.items()})
    args = [] if kind == "file" else [f"--okq-store={kind}"]
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=PASSED + len(EXAMPLES), failed=1)
    result.stdout.fnmatch_lines([f"okq: okq_server on the {kind} store",
                                 f"*test_fails_on_purpose*{FAILURE}*"])


def test_a_store_okq_has_not_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", pyproject=PYTEST_CONFIG)
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--okq-store=redis")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--okq-store: invalid choice: 'redis'*"])


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    """pytest loads it in every run of the environment: okq's modules, aiohttp, moto and
    boto3 wait for a test that asks for a fixture."""
    code = ("import sys, okq.testing; print(' '.join(m for m in ('aiohttp', 'moto', 'boto3', "
            "'okq.client', 'okq.server', 'okq.engine', 'okq.testing.node') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert loaded == []


def test_no_fixture_of_okqs_own_suite_has_a_plugin_fixtures_name() -> None:
    """A fixture of okq's own tests with one of these names would hide the plugin's."""
    assert {"okq_server", "okq_client", "okq_queue", "okq_drain"} <= set(FIXTURES)
    clashes = [f"{path.relative_to(TESTS)}:{node.lineno} {node.name}"
               for path in TESTS.rglob("*.py") if "def okq_" in (text := path.read_text())
               for node in ast.walk(ast.parse(text))
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
               and node.name in FIXTURES]
    assert clashes == []
