"""Lease tokens (okq/tokens.py): signing, verification, tampering and key rotation."""

from __future__ import annotations

import base64
import gc
import hashlib
import hmac

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from okq.errors import InvalidToken
from okq.tokens import Delivery, TokenSigner, by_lease_object, key_id, shared_head
from tests.engines import property_examples

#: Each test runs on the pure and the compiled hot path (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("hot_path")

K1 = b"k1" * 16
K2 = b"k2" * 16
D = Delivery("ns", "orders", "018b5e3c2a00-0123456789", 17, 3)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def refused(signer: TokenSigner, token: object, namespace: str = "ns") -> InvalidToken:
    with pytest.raises(InvalidToken) as info:
        signer.verify(token, namespace)  # type: ignore[arg-type]
    assert info.value.message
    assert info.value.details["field"] == "token"
    assert info.value.code == "invalid_token" and info.value.status == 400
    return info.value


def test_round_trip() -> None:
    s = TokenSigner([K1])
    token = s.sign(D)
    assert isinstance(token, str) and token.count(".") == 3  # version 2, the default
    assert s.verify(token, "ns") == D
    assert TokenSigner([K1]).verify(token, "ns") == D  # a node that did not mint it


@pytest.mark.parametrize("version", [1, 2])
def test_every_node_reads_both_layouts(version: int) -> None:
    token = TokenSigner([K1], version).sign(D)
    assert token.count(".") == {1: 1, 2: 3}[version]
    for reader in (1, 2):
        assert TokenSigner([K1], reader).verify(token, "ns") == D


def test_unknown_layout_version_is_refused() -> None:
    with pytest.raises(ValueError, match="token format 3"):
        TokenSigner([K1], 3)


@given(
    ns=st.text(min_size=1, max_size=30),
    queue=st.text(max_size=30),
    segment=st.text(max_size=30),
    index=st.integers(-(2**63), 2**63 - 1),  # okq's are never negative; the layouts allow it
    v=st.integers(0, 2**63 - 1),
    version=st.sampled_from([1, 2]),
)
def test_round_trip_any_delivery(ns: str, queue: str, segment: str, index: int, v: int,
                                 version: int) -> None:
    s = TokenSigner([K1], version)
    d = Delivery(ns, queue, segment, index, v)
    token = s.sign(d)
    assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in token)
    assert s.verify(token, ns) == d
    assert TokenSigner([K1]).verify(token, ns) == d


#: A lease's tokens of one segment: its names and its deliveries (index, v).
SEGMENT_BATCHES = {
    "ns": st.text(min_size=1, max_size=30),
    "queue": st.text(max_size=30),
    "segment": st.text(max_size=30),
    "deliveries": st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
                           max_size=20),
}


@given(**SEGMENT_BATCHES)
def test_sign_many_spells_each_token_as_the_documented_layout(
        ns: str, queue: str, segment: str, deliveries: list[tuple[int, int]]) -> None:
    """A batch's tokens, their shared head packed once, are byte for byte the
    layout of the module docstring (what nodes of every version verify), and each
    verifies on another node, which has no memory of minting it."""
    tokens = TokenSigner([K1], 1).sign_many(ns, queue, segment, deliveries)
    other = TokenSigner([K1])
    assert len(tokens) == len(deliveries)
    for token, (index, v) in zip(tokens, deliveries, strict=True):
        body, mac = token.split(".")
        assert unb64(body) == msgpack.packb([key_id(K1), ns, queue, segment, index, v])
        assert unb64(mac) == hmac.new(K1, unb64(body), hashlib.sha256).digest()[:16]
        assert other.verify(token, ns) == Delivery(ns, queue, segment, index, v)


@given(**SEGMENT_BATCHES)
def test_version_2_tokens_are_spelt_as_documented(
        ns: str, queue: str, segment: str, deliveries: list[tuple[int, int]]) -> None:
    """Version 2, made here from the module docstring with hashlib alone."""
    tokens = TokenSigner([K1]).sign_many(ns, queue, segment, deliveries)
    other = TokenSigner([K1])
    head = b64(msgpack.packb([key_id(K1), ns, queue, segment]))
    for token, (index, v) in zip(tokens, deliveries, strict=True):
        signed = f"{head}.{index}.{v}"
        mac = hashlib.blake2b(signed.encode(), key=K1, digest_size=16,
                              person=b"okq-token-v2").hexdigest()
        assert token == f"{signed}.{mac}"
        assert other.verify(token, ns) == Delivery(ns, queue, segment, index, v)


def v2_parts(token: str) -> list[str]:
    parts = token.split(".")
    assert len(parts) == 4
    return parts


@pytest.mark.parametrize("change", [
    lambda p: [p[0], str(int(p[1]) + 1), p[2], p[3]],  # another item
    lambda p: [p[0], p[1], str(int(p[2]) + 1), p[3]],  # the next delivery
    lambda p: [p[0], p[1], p[2], p[3][:-1] + ("1" if p[3][-1] == "0" else "0")],
    lambda p: [p[0], p[1], p[2], p[3].upper()],
    lambda p: [p[0], p[1], p[2], p[3][:-2]],
    lambda p: [p[0], p[1], p[2], ""],
    lambda p: [p[0], p[1], p[2], "é" * 32],
])
def test_version_2_edits_are_bad_signatures(change: object) -> None:
    s = TokenSigner([K1])
    edited = ".".join(change(v2_parts(s.sign(D))))  # type: ignore[operator]
    assert "bad signature" in refused(s, edited).message


@pytest.mark.parametrize("spelling",
                         ["017", "+17", " 17", "1_7", "17 ", "-017", "-0", "", "\uff11\uff17"])
def test_version_2_numbers_have_one_spelling(spelling: str) -> None:
    """No two strings name one token: 17 is spelt "17" and nothing else."""
    s = TokenSigner([K1])
    head, _, v, mac = v2_parts(s.sign(D))
    assert "not an okq lease token" in refused(s, f"{head}.{spelling}.{v}.{mac}").message


def test_version_2_head_of_another_shape_is_refused() -> None:
    s = TokenSigner([K1])
    for head in ([key_id(K1), "ns", "q"], {"kid": 1}, "text", [key_id(K1), "ns", "q", "s", 0]):
        token = f"{b64(msgpack.packb(head))}.1.2.{'0' * 32}"
        assert "not an okq lease token" in refused(s, token).message


def test_version_2_key_rotation_and_namespace() -> None:
    token = TokenSigner([K2, K1]).sign(D)
    assert TokenSigner([K1, K2]).verify(token, "ns") == D
    assert "unknown key" in refused(TokenSigner([K1]), token).message
    assert "another namespace" in refused(TokenSigner([K2]), token, namespace="other").message


def test_field_name_is_used_in_errors() -> None:
    err = TokenSigner([K1])
    with pytest.raises(InvalidToken, match=r"^receipt ") as info:
        err.verify("junk", "ns", field="receipt")
    assert info.value.details["field"] == "receipt"


def test_tampered_body_is_refused() -> None:
    s = TokenSigner([K1], 1)
    body, mac = s.sign(D).split(".")
    fields = msgpack.unpackb(unb64(body))
    fields[5] = D.v + 1  # claim the next delivery
    forged = f"{b64(msgpack.packb(fields))}.{mac}"
    assert "bad signature" in refused(s, forged).message


def test_tampered_mac_is_refused() -> None:
    s = TokenSigner([K1], 1)
    body, mac = s.sign(D).split(".")
    raw = bytearray(unb64(mac))
    raw[0] ^= 1
    assert "bad signature" in refused(s, f"{body}.{b64(bytes(raw))}").message


@pytest.mark.parametrize("cut", ["mac", "body", "dot"])
def test_truncated_token_is_refused(cut: str) -> None:
    s = TokenSigner([K1], 1)
    token = s.sign(D)
    body, mac = token.split(".")
    variant = {
        "mac": f"{body}.{mac[:-4]}",
        "body": f"{body[:-4]}.{mac}",
        "dot": body,
    }[cut]
    refused(s, variant)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        ".",
        "..",
        "a.b.c",
        "not a token",
        "é.é",
        "!!!.???",
        "AAAA.AAAA",
        b64(msgpack.packb([1, 2, 3])) + "." + b64(b"x" * 16),
        b64(msgpack.packb({"kid": 1})) + "." + b64(b"x" * 16),
        b64(b"\xc1") + "." + b64(b"x" * 16),
    ],
)
def test_garbage_is_refused(garbage: str) -> None:
    assert "not an okq lease token" in refused(TokenSigner([K1]), garbage).message


@pytest.mark.parametrize("garbage", [None, 5, b"a.b"])
def test_non_string_is_refused(garbage: object) -> None:
    refused(TokenSigner([K1]), garbage)


def test_other_namespace_is_refused() -> None:
    s = TokenSigner([K1])
    assert "another namespace" in refused(s, s.sign(D), namespace="other").message


def test_unknown_key_is_refused() -> None:
    token = TokenSigner([K2]).sign(D)
    assert "unknown key" in refused(TokenSigner([K1]), token).message


def test_kid_of_a_wrong_type_is_refused() -> None:
    s = TokenSigner([K1])
    body = msgpack.packb(["kid-as-text", "ns", "q", "s", 0, 1])
    assert "unknown key" in refused(s, f"{b64(body)}.{b64(b'x' * 16)}").message


def test_well_signed_but_malformed_fields_are_refused() -> None:
    s = TokenSigner([K1])
    body = msgpack.packb([key_id(K1), "ns", "q", "s", "zero", 1])
    token = f"{b64(body)}.{b64(s._mac(K1, body))}"
    assert "malformed" in refused(s, token).message


@pytest.mark.parametrize("version", [1, 2])
def test_key_rotation(version: int) -> None:
    old = TokenSigner([K1], version)
    old_token = old.sign(D)
    rotated = TokenSigner([K2, K1], version)  # new key first: it signs, both verify
    new_token = rotated.sign(D)
    assert new_token != old_token
    assert rotated.verify(old_token, "ns") == D
    assert rotated.verify(new_token, "ns") == D
    assert "unknown key" in refused(old, new_token).message  # not yet rotated
    dropped = TokenSigner([K2], version)  # old key dropped: its tokens are refused
    assert dropped.verify(new_token, "ns") == D
    assert "unknown key" in refused(dropped, old_token).message


def test_signing_uses_the_first_key() -> None:
    token = TokenSigner([K2, K1], 1).sign(D)
    kid = msgpack.unpackb(unb64(token.split(".")[0]))[0]
    assert kid == key_id(K2)


@pytest.mark.parametrize("keys", [[b""], [b"x" * 15], [K1, b"short"]])
def test_short_keys_are_refused(keys: list[bytes]) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        TokenSigner(keys)


def test_sixteen_byte_key_is_enough() -> None:
    s = TokenSigner([b"x" * 16])
    assert s.verify(s.sign(D), "ns") == D


def test_no_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        TokenSigner([])


# Every character a token could be edited to, including base64 padding and the
# standard alphabet's '+' and '/', which the decoder silently handles.
EDIT_CHARS = st.sampled_from(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=.!~ \n\x00é"
)
SIGNER = TokenSigner([K2, K1])
#: Version 1 tokens, for the tests of that layout's spelling.
V1 = TokenSigner([K2, K1], 1)
TOKENS = [V1.sign(D), TokenSigner([K1], 1).sign(Delivery("ns", "q", "s", 0, 1)),
          SIGNER.sign(D), TokenSigner([K1]).sign(Delivery("ns", "q", "s", 0, 1))]


@settings(max_examples=property_examples(200, 500),
          suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(TOKENS) - 1), data=st.data(), new=EDIT_CHARS)
def test_single_character_change_never_names_another_delivery(
    which: int, data: st.DataObject, new: str
) -> None:
    token = TOKENS[which]
    original = SIGNER.verify(token, "ns")
    pos = data.draw(st.integers(0, len(token) - 1), label="pos")
    edited = token[:pos] + new + token[pos + 1 :]
    try:
        got = SIGNER.verify(edited, "ns")
    except InvalidToken as exc:
        assert exc.message
        return
    assert got == original


def test_no_single_character_change_of_a_token_verifies() -> None:
    """The exhaustive version of the property above: tokens are canonical base64url,
    so not even the padding bits of a last character or the standard alphabet's
    twins ('+' for '-', '/' for '_') give a second spelling of the same token."""
    for token in TOKENS:
        for pos in range(len(token)):
            for new in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=.":
                if new == token[pos]:
                    continue
                edited = token[:pos] + new + token[pos + 1 :]
                with pytest.raises(InvalidToken):
                    SIGNER.verify(edited, "ns")


@pytest.mark.parametrize("where", ["body", "mac"])
def test_padded_spellings_are_refused(where: str) -> None:
    body, mac = V1.sign(D).split(".")
    variant = f"{body}==.{mac}" if where == "body" else f"{body}.{mac}=="
    refused(SIGNER, variant)


def test_standard_alphabet_spelling_is_refused() -> None:
    tokens = (V1.sign(Delivery("ns", "q", "s", 0, v)) for v in range(1000))
    token = next(t for t in tokens if "-" in t or "_" in t)
    assert SIGNER.verify(token, "ns")
    refused(SIGNER, token.replace("-", "+").replace("_", "/"))


@pytest.mark.parametrize("token", TOKENS, ids=["v1-two-keys", "v1-one-key", "two-keys",
                                                "one-key"])
def test_any_single_character_change_of_the_mac_is_a_bad_signature(token: str) -> None:
    """A well-formed token whose MAC does not verify says so, whichever character of
    the MAC was changed and to what: the last character (whose unused bits make a
    version 1 spelling non-canonical) and characters outside the alphabet included."""
    body, _, mac = token.rpartition(".")
    for pos in range(len(mac)):
        for new in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=!é ":
            if new == mac[pos]:
                continue
            edited = f"{body}.{mac[:pos]}{new}{mac[pos + 1:]}"
            assert "bad signature" in refused(SIGNER, edited).message, (pos, new)


@pytest.mark.parametrize("mac", ["", "AB", "AAAA", "A" * 23],
                         ids=["empty", "short-non-canonical", "short", "long"])
def test_a_mac_of_the_wrong_length_is_a_bad_signature(mac: str) -> None:
    body = V1.sign(D).split(".")[0]
    assert "bad signature" in refused(SIGNER, f"{body}.{mac}").message
    signed = SIGNER.sign(D).rpartition(".")[0]
    assert "bad signature" in refused(SIGNER, f"{signed}.{mac.lower()}").message


def test_the_record_of_minted_tokens_is_bounded_and_forgotten_tokens_still_verify() -> None:
    signer = TokenSigner([K1])
    signer.REMEMBER = 10  # type: ignore[misc]
    deliveries = [Delivery("ns", "q", "s", index, 1) for index in range(25)]
    tokens = [signer.sign(d) for d in deliveries]
    remembered = {**signer._older, **signer._minted}
    assert 0 < len(remembered) <= 10
    assert tokens[-1] in remembered and tokens[0] not in remembered
    # kept as plain tuples: out of the cyclic collector's sight once it has looked
    gc.collect()
    assert not any(gc.is_tracked(named) for named in remembered.values())
    for token, d in zip(tokens, deliveries, strict=True):  # remembered or not: the same answer
        assert signer.verify(token, "ns") == d
    with pytest.raises(InvalidToken, match="another namespace"):
        signer.verify(tokens[0], "other")
    with pytest.raises(InvalidToken, match="another namespace"):
        signer.verify(tokens[-1], "other")


def test_verify_many_names_the_entry_that_failed() -> None:
    signer = TokenSigner([K1])
    good = signer.sign(Delivery("ns", "q", "s", 0, 1))
    other = signer.sign(Delivery("ns", "elsewhere", "s", 0, 1))
    named = Delivery("ns", "q", "s", 0, 1)
    assert signer.verify_many([good, good], "ns", "q", "tokens[{n}]") == [named, named]
    with pytest.raises(InvalidToken, match=r"tokens\[1\] belongs to queue 'elsewhere'"):
        signer.verify_many([good, other], "ns", "q", "tokens[{n}]")
    with pytest.raises(InvalidToken, match=r"tokens\[2\] has a bad signature") as caught:
        signer.verify_many([good, good, good[:-1] + "0"], "ns", None, "tokens[{n}]")
    assert caught.value.details["field"] == "tokens[2]"


def test_deliveries_are_grouped_by_the_lease_object_they_change() -> None:
    a0, a1, b0, c0 = (Delivery("ns", "q", "A", 0, 1), Delivery("ns", "q", "A", 1, 1),
                      Delivery("ns", "q", "B", 0, 2), Delivery("ns", "r", "A", 0, 1))
    groups = by_lease_object([a0, b0, a1, c0, b0])
    assert groups == [("q", "A", [0, 2], [a0, a1]), ("q", "B", [1, 4], [b0, b0]),
                      ("r", "A", [3], [c0])]
    assert by_lease_object([]) == []


@pytest.mark.parametrize(("tokens", "head"), [
    (["h.1.1.m", "h.2.1.m", "h.3.2.m"], "h."),
    (["h.1.1.m"], "h."),
    (["h.1.1.m", "g.1.1.m"], None),
    (["h.1.1.m", "hh.1.1.m"], None),
    (["h.1.1.m", 7], None),
    ([7, "h.1.1.m"], None),
    (["no-dot"], None),
    ([], None),
])
def test_a_batchs_shared_head(tokens: list[object], head: str | None) -> None:
    assert shared_head(tokens) == head
