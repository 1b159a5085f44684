"""PoolTier's keep-alive and index bookkeeping against a per-key reference, on random op
sequences: the one-pass keep-alive (`known_only`, cached pool keys, C-level stamping) gives every
block the logical clock a per-key walk gives (so victims are the same), sends the same keys, and
the owned-entry count behind `bytes_used` matches a recount whatever puts, dedups, gets, removals
and evictions did (two instances on one real in-process pool); a put batch's frames, built in one
buffer, are byte for byte what the format says."""

from __future__ import annotations

import hashlib

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hintkv.pool.embedded import EmbeddedBackend
from hintkv.tiers.disk_format import HEADER_SIZE, block_mac, encode_header
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.pool import PoolTier

LAYOUT = BlockLayout(num_layers=1, block_size=2, num_kv_heads=1, head_dim=4, dtype=torch.float32)
FRAME = HEADER_SIZE + LAYOUT.nbytes
KEYS = [hashlib.blake2b(f"k{i}".encode(), digest_size=16).digest() for i in range(12)]


def payload(i: int) -> torch.Tensor:
    return torch.full(LAYOUT.shape, float(i), dtype=LAYOUT.dtype)


idx = st.integers(0, len(KEYS) - 1)
OP = st.one_of(
    st.tuples(st.just("put"), st.lists(idx, min_size=1, max_size=5)),
    st.tuples(st.just("get"), idx),
    st.tuples(st.just("remove"), idx),
    st.tuples(st.just("keep"), st.lists(idx, max_size=8)),  # may repeat keys, name unknown ones
    st.tuples(st.just("keep_known"), st.lists(idx, max_size=8, unique=True)),
)
OPS = st.lists(OP, max_size=40)


class Reference:
    """The per-key semantics: every put / get / kept-alive known key ticks the clock once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.clock = 0
        self.last: dict[int, int] = {}
        self.sent = 0

    def tick(self, i: int) -> None:
        self.clock += 1
        self.last[i] = self.clock

    def put(self, items: list[int]) -> None:
        for i in items:
            if i in self.last:
                self.tick(i)
        num_new = len({i for i in items if i not in self.last})
        free = self.capacity - len(self.last)
        for v in sorted(self.last, key=self.last.get)[:max(0, num_new - free)]:
            del self.last[v]
        fit = min(num_new, self.capacity - len(self.last))
        for i in items:  # in order, after the victims left (a victim of this call may return)
            if i not in self.last and fit > 0:
                fit -= 1
                self.tick(i)

    def keep(self, items: list[int], known_only: bool) -> None:
        for i in items:
            if i in self.last:
                self.tick(i)
        sent = [i for i in items if i in self.last] if known_only else list(dict.fromkeys(items))
        self.sent += len(sent)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, capacity=st.integers(2, 6))
def test_keep_alive_stamps_and_sends_what_a_per_key_walk_does(ops, capacity):
    t = PoolTier(LAYOUT, EmbeddedBackend(FRAME), capacity * FRAME)
    ref = Reference(capacity)
    try:
        for kind, arg in ops:
            if kind == "put":
                t.put([(KEYS[i], payload(i)) for i in arg])
                ref.put(arg)
            elif kind == "get":
                dst = torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)
                hit = t.get(KEYS[arg], dst).result(timeout=10)
                assert hit == (arg in ref.last)
                if hit:
                    ref.tick(arg)
                    assert torch.equal(dst, payload(arg))
            elif kind == "remove":
                assert t.remove(KEYS[arg]) == (arg in ref.last)
                ref.last.pop(arg, None)
            else:
                known_only = kind == "keep_known"
                sent = t.keep_alive([KEYS[i] for i in arg], known_only=known_only)
                ref.keep(arg, known_only)
                assert sent == (len([i for i in arg if i in ref.last]) if known_only
                                else len(set(arg)))
            t.flush()
            assert {i: t.last_access(KEYS[i]) for i in ref.last} == ref.last
            assert [t.known(k) for k in KEYS] == [i in ref.last for i in range(len(KEYS))]
            assert t.usage().bytes_used == len(ref.last) * FRAME
            assert t.pool_stats()["keepalive_keys"] == ref.sent
        t.check_integrity()
    finally:
        t.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.integers(0, 1), OP), max_size=40),
       capacity=st.integers(2, 6))
def test_owned_count_follows_dedups_remote_reads_and_removals(ops, capacity):
    backend = EmbeddedBackend(FRAME)
    tiers = [PoolTier(LAYOUT, backend, capacity * FRAME) for _ in range(2)]
    try:
        for who, (kind, arg) in ops:
            t = tiers[who]
            if kind == "put":
                t.put([(KEYS[i], payload(i)) for i in arg])
            elif kind == "get":
                t.get(KEYS[arg], torch.empty(LAYOUT.shape, dtype=LAYOUT.dtype)).result(timeout=10)
            elif kind == "remove":
                t.remove(KEYS[arg])
            else:
                t.keep_alive([KEYS[i] for i in arg], known_only=kind == "keep_known")
            t.flush()
            for x in tiers:
                x.check_integrity()  # owned count == a recount; cached pool keys are right
        stored = sum(x.usage().bytes_used for x in tiers)
        assert stored == backend.used_bytes()  # every pool block is owned by exactly one instance
    finally:
        for x in tiers:
            x.close()


def test_a_put_batch_frames_each_block_as_the_format_says():
    """One buffer for a whole batch: every frame is byte for byte header + payload, and reads
    back (bf16 payloads, a keyed MAC)."""
    layout = BlockLayout(num_layers=2, block_size=4, num_kv_heads=2, head_dim=8,
                         dtype=torch.bfloat16)
    t = PoolTier(layout, EmbeddedBackend(HEADER_SIZE + layout.nbytes),
                 8 * (HEADER_SIZE + layout.nbytes), secret=b"s3cret")
    try:
        srcs = [torch.randn(layout.shape, generator=torch.Generator().manual_seed(i))
                .to(layout.dtype) for i in range(5)]
        frames = t._frames(list(zip(KEYS, srcs)))
        fp = layout.fingerprint()
        for k, src, frame in zip(KEYS, srcs, frames):
            body = src.reshape(-1).view(torch.uint8).numpy().tobytes()
            head = encode_header(k, fp, layout.nbytes, block_mac(b"s3cret", k, fp, body))
            assert frame.numpy().tobytes() == head + body
            dst = torch.empty(layout.shape, dtype=layout.dtype)
            assert t._unframe(k, frame, dst) and torch.equal(dst.view(torch.int16),
                                                             src.view(torch.int16))
        assert not t._unframe(KEYS[1], frames[0], torch.empty(layout.shape, dtype=layout.dtype))
    finally:
        t.close()
