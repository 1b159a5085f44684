"""Block hashes: the digest is pinned (lower tiers keep blocks under it across restarts) and the
fast paths (`hash_block`'s cached packer, `hash_blocks`' one conversion for all blocks) equal the
definition, chained block by block: blake2b-128(parent + tokens as native int64)."""

from __future__ import annotations

import hashlib
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.hashing import hash_block, hash_blocks, namespace_root


def _reference(root: bytes, tokens: list[int], bs: int, start: int, end: int | None,
               parent: bytes | None) -> list[bytes]:
    prev = root if start == 0 else parent
    out = []
    full = len(tokens) // bs
    for i in range(start, full if end is None else min(end, full)):
        prev = hashlib.blake2b(prev + array("q", tokens[i * bs:(i + 1) * bs]).tobytes(),
                               digest_size=16).digest()
        out.append(prev)
    return out


def test_digest_is_pinned() -> None:
    # computed by the code of the eighth/ninth sessions (array per block): must never change
    root = namespace_root("m", "float16", 16, None)
    assert root.hex() == "a5ed099854ef48dd87114a1ddcfc5e93"
    hs = hash_blocks(root, list(range(40)) + [49151, 2**40], 16)
    assert [h.hex() for h in hs] == ["710c0f713297a687c184f06e72346760",
                                     "986c9f8aa730042ef0bdf304ad620973"]
    assert hash_block(hs[-1], [7] * 16).hex() == "02d94f416098ee87675e30d8beea3cfc"


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**63 - 1), max_size=70),
       bs=st.sampled_from([1, 2, 3, 4, 16]), start=st.integers(0, 6),
       end=st.one_of(st.none(), st.integers(0, 40)), parent=st.binary(min_size=16, max_size=16))
def test_fast_paths_equal_the_definition(tokens: list[int], bs: int, start: int,
                                         end: int | None, parent: bytes) -> None:
    root = namespace_root("t", "bf16", bs, None)
    want = _reference(root, tokens, bs, start, end, parent)
    assert hash_blocks(root, tokens, bs, start=start, parent=parent, end=end) == want
    prev = root if start == 0 else parent
    for i, h in enumerate(want):  # one block at a time, as a decode step's commit does
        k = start + i
        prev = hash_block(prev, tokens[k * bs:(k + 1) * bs])
        assert prev == h
