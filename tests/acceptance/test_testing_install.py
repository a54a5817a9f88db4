"""A project outside okq's tree installs ``okq[testing]``, and its own tests, written
against okq.testing's fixtures (tests/plugin_user.py), pass on memory:// and moto,
in one pytest run: its conftest.py asks for every test on each store.

The project is made in a temporary folder with its own pyproject.toml, which
depends on ``okq[testing]``; a new virtual environment gets okq (built from a copy
of this checkout) and the project installed by pip, with nothing downloaded: the
environment sees this one's packages (a .pth line), pip builds without isolation
and without an index, and ``OKQ_PURE=1`` skips the mypyc compile (setup.py). pytest
then finds the plugin by its entry point, as it would in the user's environment.

The project's tests run on memory:// and on moto (``OKQ_INSTALL_STORES``, a
comma-separated list, picks others), about 12 s of CPU in all.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from tests.plugin_user import PASSED, PYTEST_CONFIG, USER_TESTS

ROOT = Path(__file__).resolve().parent.parent.parent
#: The stores the project's tests run on (see the module's docstring).
STORES = [kind.strip() for kind in os.environ.get("OKQ_INSTALL_STORES", "memory,moto").split(",")]
#: What building okq takes from the checkout.
SOURCES = ("okq", "compactor", "pyproject.toml", "setup.py", "README.md")
#: Plugins of okq's own test environment that a user's would not have, and that take
#: seconds to import: not loaded in the project's runs.
NOT_THEIRS = ("-p", "no:hypothesispytest", "-p", "no:schemathesis")

PROJECT = '''
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "shop"
version = "1.0"
requires-python = ">=3.11"
dependencies = ["okq"]

[project.optional-dependencies]
test = ["okq[testing]"]

[tool.setuptools]
py-modules = ["shop"]
'''

SHOP = '''
"""The user's code: orders go to a queue."""


async def place(client, queue, order):
    [item_id] = await client.produce(queue, [order.encode()])
    return item_id
'''

#: The project's conftest.py: every test on each store, in one run (docs/TESTING.md).
CONFTEST = '''
import pytest


@pytest.fixture(scope="session", params={stores!r})
def okq_store_kind(request):
    return request.param
'''

SHOP_TESTS = '''
from shop import place


async def test_an_order_is_placed(okq_client, okq_queue, okq_drain):
    queue = okq_queue("orders")
    await place(okq_client, queue, "one coffee")
    seen = []

    async def handler(item):
        seen.append(item.bytes)

    assert (await okq_drain(queue, handler)).completed == 1
    assert seen == [b"one coffee"]
'''


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without what pytest and xdist set for their own runs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


def make_project(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(PROJECT + PYTEST_CONFIG)
    (folder / "shop.py").write_text(SHOP)
    (folder / "tests" / "conftest.py").write_text(CONFTEST.format(stores=STORES))
    (folder / "tests" / "test_user.py").write_text(USER_TESTS)
    (folder / "tests" / "test_shop.py").write_text(SHOP_TESTS)
    return folder


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """What a build or an install left in the checkout (see .gitignore)."""
    if Path(folder).name == "_compiled":
        return {name for name in names if name != "__init__.py"}
    return {name for name in names if name in ("__pycache__", "build") or name.endswith(".so")}


def copy_okq(folder: Path) -> Path:
    """The checkout's sources, to build okq from outside the checkout."""
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=_not_sources)
        else:
            shutil.copy2(source, folder / name)
    return folder


def make_venv(folder: Path) -> Path:
    """A venv whose packages include this environment's (its site-packages, by a .pth
    line: not its .pth files, so not okq's editable install)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(folder)], check=True)
    python = folder / "bin" / "python"
    [own] = (folder / "lib").glob("python3*/site-packages")
    (own / "test-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def test_a_project_outside_okqs_tree_installs_okq_testing_and_its_tests_pass(
        tmp_path: Path) -> None:
    project = make_project(tmp_path / "shop")
    python = make_venv(tmp_path / "venv")
    # --no-compile: the run compiles the modules it imports, not pip all of them (1 s)
    install = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
               "--no-compile", f"{copy_okq(tmp_path / 'okq-src')}[testing]", f"{project}[test]"]
    subprocess.run(install, check=True, cwd=tmp_path, env=clean_environment(OKQ_PURE="1"),
                   capture_output=True)
    probe = "import okq.native, okq.testing; print(okq.testing.__file__); print(okq.native.CHOICE)"
    where, choice = subprocess.run([str(python), "-c", probe], check=True, capture_output=True,
                                   text=True, cwd=tmp_path).stdout.splitlines()
    assert where.startswith(str(tmp_path / "venv")), where  # the installed okq, not ours
    assert "OKQ_PURE was set when it was built" in choice, choice  # no mypyc compile

    run = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-v",
                          *NOT_THEIRS],
                         cwd=project, env=clean_environment(), capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(STORES) * (PASSED + 1)} passed" in run.stdout, run.stdout
    for kind in STORES:
        assert f"test_an_order_is_placed[{kind}] PASSED" in run.stdout, run.stdout
