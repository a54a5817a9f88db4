"""Which implementation of the per-item hot path this process runs: compiled or pure.

okq/_pure/leases.py and okq/_pure/tokens.py are the hot path in pure Python
and the reference. An install with a C compiler also compiles them with mypyc
into okq/_compiled/ (setup.py), and records in okq/_compiled/build.json whether
it did, why not, and the SHA-256 of each source it compiled. okq/leases.py and
okq/tokens.py hand their callers one implementation or the other, the one
chosen here, once per process, at import:

* compiled, when the build made it from the sources beside it (an editable
  install whose okq/_pure file changed since is stale: ``pip install -e .``
  rebuilds it), it loads, and ``OKQ_PURE`` is unset (or ``0``);
* pure otherwise, with the reason in :data:`CHOICE`.

The variable is read here, at import, rather than with the node's settings:
the hot path is imported long before any settings exist, and it picks how the
code runs, not what the node does. The node logs :func:`describe` once at
start-up.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The modules of okq/_pure/ that the build compiles.
MODULES = ("leases", "tokens")
HERE = Path(__file__).resolve().parent
#: Written by setup.py; absent from a checkout that was never installed.
RECORD = HERE / "_compiled" / "build.json"
#: What the pure path costs, as measured (docs/PERFORMANCE.md, "The compiled hot path").
PURE_COST = ("about 85 % more instructions per lease+complete message through the engine "
             "(produce: the same)")


@dataclass(frozen=True)
class Choice:
    compiled: bool
    reason: str  # why the pure path runs; "" when the compiled one does
    built: bool  # whether the install compiled the modules at all (OKQ_PURE aside)


def source_digest(name: str) -> str:
    """The SHA-256 of okq/_pure/{name}.py, as the build records the sources it compiled."""
    return hashlib.sha256((HERE / "_pure" / f"{name}.py").read_bytes()).hexdigest()


def read_record() -> dict[str, object]:
    """What the build recorded, or a record saying there was no build."""
    try:
        record: dict[str, object] = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {"compiled": False, "reason": "this checkout was never built (no build record)"}
    return record


def _choose() -> Choice:
    record = read_record()
    built = bool(record.get("compiled"))
    if not built:
        return Choice(False, f"the install did not compile it: {record.get('reason')}", False)
    sources = record.get("sources")
    for name in MODULES:
        if not isinstance(sources, dict) or sources.get(name) != source_digest(name):
            return Choice(False, f"okq/_pure/{name}.py changed since it was compiled "
                                 "(pip install -e . compiles it again)", True)
    if os.environ.get("OKQ_PURE", "") not in ("", "0"):
        return Choice(False, "OKQ_PURE is set", True)
    try:
        for name in MODULES:
            importlib.import_module(f"okq._compiled.{name}")
    except ImportError as exc:
        return Choice(False, f"the compiled modules do not load: {exc}", True)
    return Choice(True, "", True)


CHOICE = _choose()
#: Whether okq/leases.py and okq/tokens.py hand out the compiled implementation.
COMPILED = CHOICE.compiled


def describe() -> str:
    """The node's start-up line about its hot path."""
    if COMPILED:
        signs_in_c = getattr(importlib.import_module("okq._compiled.tokens"), "_C_SIGN", None)
        return ("hot path: compiled (mypyc build of okq/_pure/leases.py and tokens.py; "
                + ("tokens signed in C)" if signs_in_c is not None else
                   "tokens signed with hashlib: okq._compiled.signv2 did not load)"))
    return f"hot path: pure Python, since {CHOICE.reason}; it costs {PURE_COST}"


def implementations(name: str) -> dict[str, ModuleType]:
    """Every implementation of hot-path module ``name`` this install can load, by
    kind ("pure", "compiled"), whichever this process chose: for tests and benchmarks."""
    found = {"pure": importlib.import_module(f"okq._pure.{name}")}
    if CHOICE.built:
        try:
            found["compiled"] = importlib.import_module(f"okq._compiled.{name}")
        except ImportError:
            pass
    return found
