"""The compiled hot path (okq/native.py, setup.py): that an install with a C compiler
runs it, that OKQ_PURE turns it off, and that it behaves as the pure one does,
byte for byte and error for error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from okq import native
from tests.engines import property_examples

PROBE = ("import json, okq.leases, okq.tokens, okq.native as n; print(json.dumps("
         "[n.COMPILED, n.CHOICE.reason, okq.leases.ItemState.__module__, "
         "okq.tokens.TokenSigner.__module__, n.describe()]))")


def probe(**env: str) -> list[Any]:
    """What a fresh process chooses, with ``env`` on top of this one's (OKQ_PURE dropped)."""
    base = {k: v for k, v in os.environ.items() if k != "OKQ_PURE"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, check=True,
                         capture_output=True, text=True).stdout
    answer: list[Any] = json.loads(out)
    return answer


def compiled_or_skip() -> dict[str, ModuleType]:
    found = {name: native.implementations(name) for name in native.MODULES}
    if any("compiled" not in kinds for kinds in found.values()):
        pytest.skip(f"no compiled hot path in this install: {native.CHOICE.reason}")
    return {name: kinds["compiled"] for name, kinds in found.items()}


def test_an_install_with_a_c_compiler_runs_the_compiled_path() -> None:
    """Skipped only where the build found no C compiler at all: a build that had one and
    failed, a stale build, a missing record or modules that do not load fail here."""
    record = native.read_record()
    if not record.get("compiled") and record.get("compiler") is None and \
            str(record.get("reason", "")).startswith("there is no C compiler"):
        pytest.skip(f"the install found no C compiler, so runs the pure path: {record['reason']}")
    assert record.get("compiled"), f"the hot path was not compiled: {native.CHOICE.reason}"
    assert native.CHOICE.built, native.CHOICE.reason
    compiled, reason, leases_home, tokens_home, line = probe()
    assert (compiled, reason) == (True, ""), reason
    assert (leases_home, tokens_home) == ("okq._compiled.leases", "okq._compiled.tokens")
    assert "compiled" in line and "tokens signed in C" in line, line


def test_okq_pure_gives_the_pure_path() -> None:
    compiled, reason, leases_home, tokens_home, line = probe(OKQ_PURE="1")
    assert compiled is False
    assert (leases_home, tokens_home) == ("okq._pure.leases", "okq._pure.tokens")
    if native.CHOICE.built:  # else the reason is the build's own
        assert reason == "OKQ_PURE is set"
    assert line.startswith("hot path: pure Python, since ") and native.PURE_COST in line


def test_okq_pure_0_leaves_the_choice_to_the_build() -> None:
    assert probe(OKQ_PURE="0")[0] == native.CHOICE.built


# -- the two implementations alike --------------------------------------------------

NOW = 1_700_000_000_000
OPS = st.lists(st.tuples(
    st.sampled_from(["lease", "complete", "complete_out", "retry", "retry_dead", "renew",
                     "finish_outputs", "abandon", "finish_dead", "expire", "seal", "recode"]),
    st.integers(0, 3),  # item
    st.integers(-1, 1),  # delivery: the current one, or one off
    st.integers(0, 100_000),  # time step
), max_size=40)


def run(tr: ModuleType, ops: list[tuple[str, int, int, int]]) -> list[Any]:
    """What each op answers (or raises), and the object's bytes after each."""
    obj = tr.LeaseObject("018b5e3c2a00-0123456789")
    now, seen = NOW, []
    for op, i, dv, step in ops:
        now += step
        st_ = obj.items.get(i)
        v = (st_.v if st_ else 0) + dv
        calls: dict[str, Any] = {
            "lease": lambda o, i, v, t, d: tr.lease(o, [(i, NOW), (i + 1, NOW)], t, 9_000, 3, "q"),
            "complete": lambda o, i, v, t, d: tr.complete(o, i, v, t),
            "complete_out": lambda o, i, v, t, d: tr.complete(o, i, v, t, ["q", "s", 1, t, 9]),
            "retry": lambda o, i, v, t, d: tr.retry(o, i, v, t, t + 5, False, "boom", 3, rq="r2"),
            "retry_dead": lambda o, i, v, t, d: tr.retry(o, i, v, t, None, True, "poison", 0),
            "renew": lambda o, i, v, t, d: tr.renew(o, i, v, t, 10_000),
            "finish_outputs": lambda o, i, v, t, d: tr.finish_outputs(o, i, v),
            "abandon": lambda o, i, v, t, d: tr.abandon_outputs(o, i, v, t, "gone", back=bool(d)),
            "finish_dead": lambda o, i, v, t, d: tr.finish_dead(o, i, v),
            "expire": lambda o, i, v, t, d: tr.expire(o, [i, i + 1], t, bool(d)),
            "seal": lambda o, i, v, t, d: tr.seal(o),
            "recode": lambda o, i, v, t, d: tr.summarise(o, 5, [(NOW, k, NOW) for k in range(5)]),
        }
        try:
            answer: Any = calls[op](obj, i, v, now, dv)
        except Exception as exc:  # the error is part of the behaviour compared
            answer = (type(exc).__name__, str(exc), getattr(exc, "details", None))
        if op == "recode":
            obj = tr.decode_lease(tr.encode_lease(obj))
        seen.append((repr(answer), tr.encode_lease(obj)))
    return seen


@settings(max_examples=property_examples(120, 300), deadline=None)
@given(ops=OPS)
def test_both_make_the_same_objects_and_answers(ops: list[tuple[str, int, int, int]]) -> None:
    compiled = compiled_or_skip()["leases"]
    pure = native.implementations("leases")["pure"]
    assert run(compiled, ops) == run(pure, ops)


GARBAGE = ["", ".", "a.b", "x" * 40, "AAAA.AAAA", "éé.éé", None, 5, b"a.b"]


def test_both_sign_alike_and_read_each_others_tokens() -> None:
    compiled = compiled_or_skip()["tokens"]
    pure = native.implementations("tokens")["pure"]
    keys = [b"k2" * 16, b"k1" * 16]
    signers = {kind: m.TokenSigner(keys) for kind, m in (("pure", pure), ("compiled", compiled))}
    for index in (0, 17, 2**40):
        tokens = {kind: s.sign(m.Delivery("ns", "q", "seg", index, 3))
                  for (kind, s), m in zip(signers.items(), (pure, compiled), strict=True)}
        assert tokens["pure"] == tokens["compiled"]
        fresh = {kind: m.TokenSigner(keys) for kind, m in (("pure", pure), ("compiled", compiled))}
        got = [(d.namespace, d.queue, d.segment, d.index, d.v)
               for d in (fresh["pure"].verify(tokens["compiled"], "ns"),
                         fresh["compiled"].verify(tokens["pure"], "ns"))]
        assert got == [("ns", "q", "seg", index, 3)] * 2
    for token in [*GARBAGE, tokens["pure"][:-1], tokens["pure"].replace(".", "..")]:
        errors = []
        for s in (pure.TokenSigner(keys), compiled.TokenSigner(keys)):
            with pytest.raises(Exception) as info:
                s.verify(token, "ns")
            errors.append((type(info.value).__name__, str(info.value), info.value.details))
        assert errors[0] == errors[1], token


def test_the_compiled_tokens_module_signs_version_2_in_c() -> None:
    """okq/_native/signv2.c is built with the compiled modules, which sign with it;
    the pure module never does."""
    compiled = compiled_or_skip()["tokens"]
    assert compiled._C_SIGN is not None, "okq._compiled.signv2 was not built or does not load"
    assert native.implementations("tokens")["pure"]._C_SIGN is None


@settings(max_examples=property_examples(150, 2000), deadline=None)
@given(key=st.binary(min_size=16, max_size=64),
       names=st.lists(st.text(min_size=1, max_size=90), min_size=3, max_size=3),
       deliveries=st.lists(st.tuples(st.integers(0, 2**64), st.integers(0, 2**64)),
                           max_size=6),
       as_list=st.booleans())
def test_tokens_signed_in_c_are_those_signed_in_python(
        key: bytes, names: list[str], deliveries: list[tuple[int, int]], as_list: bool) -> None:
    """Byte for byte, and recorded alike, whatever the key, the names (the prefix's
    length crosses BLAKE2b's 128-byte blocks) and the numbers (past 2**63 - 1, or not
    a list, the C signer declines and Python signs)."""
    compiled = compiled_or_skip()["tokens"]
    pure = native.implementations("tokens")["pure"]
    signers = [m.TokenSigner([key]) for m in (pure, compiled)]
    given_to = deliveries if as_list else tuple(deliveries)
    made = [s.sign_many(*names, given_to) for s in signers]
    assert made[0] == made[1]
    assert signers[0]._minted == signers[1]._minted
    assert {tuple(v) for v in signers[1]._minted.values()} == {(*names, i, v)
                                                               for i, v in deliveries}
