"""Lease tokens' interface: signing and checking who may renew, complete or retry.

Callers use the names of ``__all__`` (``TokenSigner``, ``Delivery``, ...) and get
one implementation, chosen once per process by okq/native.py as for
okq/leases.py: the mypyc build of okq/_pure/tokens.py, or that module itself.
The token format is documented there; tests/unit/test_tokens.py runs on each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from okq import native

if TYPE_CHECKING or not native.COMPILED:
    from okq._pure.tokens import *  # noqa: F403
    from okq._pure.tokens import __all__
else:
    from okq._compiled.tokens import *  # noqa: F403
    from okq._compiled.tokens import __all__  # noqa: F401
