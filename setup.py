"""Compiles okq's per-item hot path with mypyc when it can, and installs the pure
path when it cannot: ``pip install .`` and ``pip install -e .`` stay one command
(pyproject.toml holds everything else).

mypyc names a module by its file, so okq/_pure/leases.py and tokens.py are
copied to okq/_compiled/ for the moment mypyc generates C from them, then
removed; the C is compiled as okq._compiled.leases and okq._compiled.tokens.
okq/_native/signv2.c, which the compiled tokens module signs with, is compiled
with them as okq._compiled.signv2 (the record does not hash it: a stale build of
it signs the same tokens, which tests/unit/test_tokens.py holds it to), and
okq/_native/uring.c as okq.store._uring, the file store's data syncs through
io_uring (a stub that refuses elsewhere than Linux).
okq/_compiled/build.json records whether that happened, why not, and the
SHA-256 of each source compiled, and the C compiler found (or none): okq/native.py
reads it to choose. Nothing here fails the install: without mypyc or a working C
compiler, the record says why and okq runs the pure path.

``OKQ_PURE=1`` in the build's environment skips the compilation (about 25 s) and
installs the pure path, as it chooses the pure path at run time: for a throwaway
install (tests/acceptance/test_testing_install.py installs okq into a venv).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

ROOT = Path(__file__).resolve().parent
MODULES = ("leases", "tokens")
COMPILED = ROOT / "okq" / "_compiled"
#: mypy options for generating the C: the copies are typed as okq/_pure's modules
#: are (CI's strict mypy checks those), with the okq modules they import read for
#: their types (a class from a module not read, OkqError, would make mypyc's code
#: crash) and no other (okq/__init__.py would bring all of okq: 45 s more); a
#: library missing from the build's environment (msgpack, pydantic) is untyped.
MYPY_CONFIG = """[mypy]
follow_imports = skip
ignore_missing_imports = True
[mypy-okq.changes,okq.errors,okq.model,okq.keys,okq.limits]
follow_imports = silent
"""


def c_compiler() -> str | None:
    """Where the C compiler that setuptools runs (``CC``, else Python's own) is, if anywhere."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0])


def write_record(folder: Path, compiled: bool, reason: str) -> None:
    sources = {name: hashlib.sha256((ROOT / "okq" / "_pure" / f"{name}.py").read_bytes())
               .hexdigest() for name in MODULES}
    record = {"compiled": compiled, "reason": reason, "compiler": c_compiler(),
              "sources": sources if compiled else {}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "build.json").write_text(json.dumps(record, indent=1) + "\n")


def compiled_extensions() -> tuple[list[Extension], str]:
    """mypyc's extensions for okq/_pure's modules, or none and the reason."""
    if os.environ.get("OKQ_PURE", "") not in ("", "0"):
        return [], "OKQ_PURE was set when it was built"
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        return [], f"mypyc is not installed ({exc})"
    copies = [COMPILED / f"{name}.py" for name in MODULES]
    config = ROOT / "build" / "okq-mypyc.ini"
    try:
        config.parent.mkdir(exist_ok=True)
        config.write_text(MYPY_CONFIG)
        for name, copy in zip(MODULES, copies, strict=True):
            shutil.copyfile(ROOT / "okq" / "_pure" / f"{name}.py", copy)
        extensions: list[Extension] = mypycify(
            ["--config-file", str(config), *(str(c.relative_to(ROOT)) for c in copies)],
            group_name="okq._compiled.hotpath")
        # Version 2 tokens signed in C, which the compiled tokens module uses.
        extensions.append(Extension("okq._compiled.signv2", ["okq/_native/signv2.c"]))
        # The file store's data syncs through io_uring (a stub elsewhere than Linux):
        # a store module, below the hot path's layer; okq/store/file.py loads it.
        extensions.append(Extension("okq.store._uring", ["okq/_native/uring.c"]))
    except (Exception, SystemExit) as exc:  # mypy reports its errors by exiting
        return [], f"mypyc could not translate it ({exc!r})"
    finally:
        for copy in copies:
            copy.unlink(missing_ok=True)
    return extensions, ""


class OptionalBuildExt(build_ext):
    """build_ext that has mypyc write the C first (here, not when setup.py is loaded:
    pip loads it three times per install), and installs the pure path when mypyc or
    the C compiler is missing or fails. The record goes beside the extensions: into
    the checkout for an editable install, into the wheel otherwise."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules, self.not_compiled = compiled_extensions()
        super().finalize_options()

    def run(self) -> None:
        folder = Path(self.get_ext_fullpath("okq._compiled.leases")).parent
        if not self.extensions:
            write_record(folder, False, self.not_compiled)
            return
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError, OSError) as exc:
            why = (f"the C compiler failed ({exc})" if c_compiler() else
                   f"there is no C compiler ({exc})")
            print(f"okq: the hot path was not compiled: {why}; installing the pure path")
            write_record(folder, False, why)
            return
        write_record(folder, True, "")


#: Stands for mypyc's extensions until build_ext makes them: a build with extensions.
PLACEHOLDER = Extension("okq._compiled.leases", sources=[])

setup(ext_modules=[PLACEHOLDER], cmdclass={"build_ext": OptionalBuildExt})
