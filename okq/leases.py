"""The lease-object hot path's interface: item states, their transitions, their coding.

Callers use the names of ``__all__`` only (``from okq import leases as tr``,
``from okq.leases import LEASED``) and get one implementation of them, chosen
once per process by okq/native.py: the mypyc build of okq/_pure/leases.py that
the install compiled when it had a C compiler, or okq/_pure/leases.py itself,
the pure-Python reference (always with ``OKQ_PURE=1``). The states, the
transitions and their diagram are documented there. Objects of the two are
not to be mixed, which going through this module ensures. Both write the same
bytes and behave alike (tests/unit/test_stored_bytes.py and
tests/unit/test_transitions.py run on each, tests/unit/test_native.py compares
them), and depend only downward (okq/model.py's format framing,
okq/changes.py, okq/errors.py, okq/headers.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from okq import native

if TYPE_CHECKING or not native.COMPILED:
    from okq._pure.leases import *  # noqa: F403
    from okq._pure.leases import __all__
else:
    from okq._compiled.leases import *  # noqa: F403
    from okq._compiled.leases import __all__  # noqa: F401
