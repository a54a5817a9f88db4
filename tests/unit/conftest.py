"""The hot path's unit tests run on each implementation of it: pure and compiled.

A test module that says ``pytestmark = pytest.mark.usefixtures("hot_path")``
keeps its plain imports (``from okq import leases as tr``, ``from okq.leases
import ItemState``, ``from okq.tokens import TokenSigner``): for each
implementation in turn, ``hot_path`` rebinds the names the module took from
okq/leases.py and okq/tokens.py to that implementation's (module-level objects
of theirs, a ``Delivery`` or a ``TokenSigner``, are made again in it), runs
the module's tests, and puts the names back. Tests show ``[pure]`` or
``[compiled]``. Where the install compiled nothing, the compiled runs are
skipped with the build's reason (tests/unit/test_native.py fails then, unless
the build found no C compiler at all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

import okq.leases
import okq.tokens
from okq import native

FACADES = {"leases": okq.leases, "tokens": okq.tokens}


def _in(chosen: ModuleType, facade: ModuleType, value: Any) -> Any:
    """``value`` as implementation ``chosen`` has it, if it is of ``facade``'s."""
    if value is facade:
        return chosen
    for name in facade.__all__:
        ours = getattr(facade, name)
        if value is ours:
            return getattr(chosen, name)
        if isinstance(ours, type) and type(value) is ours:
            theirs = getattr(chosen, name)
            if dataclasses.is_dataclass(value):
                return theirs(**{f.name: getattr(value, f.name)
                                 for f in dataclasses.fields(value) if f.init})
            return theirs(value.keys, value.version)  # a TokenSigner: the only other instances
    return value


@pytest.fixture(scope="module", params=["pure", "compiled"])
def hot_path(request: pytest.FixtureRequest) -> Iterator[str]:
    kind: str = request.param
    chosen = {name: native.implementations(name).get(kind) for name in FACADES}
    if None in chosen.values():
        pytest.skip(f"no compiled hot path in this install: {native.CHOICE.reason}")
    module = request.module
    saved = dict(vars(module))
    for name, facade in FACADES.items():
        for var, value in list(vars(module).items()):
            setattr(module, var, _in(chosen[name], facade, value))
    yield kind
    for var, value in saved.items():
        setattr(module, var, value)
