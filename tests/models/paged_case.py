"""A batch of sequences over scattered, shuffled cache blocks, for the paged attention tests.

`PagedCase.build(steps, ...)`: per sequence (new tokens, total context), random K/V for the whole
context, the cached part to be written into a cache (`fill`), the new part as the step's q/k/v, and
the `AttentionMetadata` of the step; `attend(cache)` runs `paged_attention` over a filled cache;
`dense_reference` is the plain causal attention every kernel is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hintkv.models.attention import AttentionMetadata, paged_attention, write_kv


def dense_reference(q, k, v, scale, compute=torch.float32):
    """Causal attention of the last len(q) positions over all of k/v ([L, H, D] layouts), computed
    in `compute` (float64 for a reference finer than the float32 paths), returned as float32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.to(compute), k.to(compute)) * scale
    ctx, n = k.shape[0], q.shape[0]
    allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.to(compute)).float()


@dataclass
class PagedCase:
    steps: list[tuple[int, int]]
    d: int
    nblocks: int
    tables: list[torch.Tensor]
    qsl: list[int]
    slots: list[int]
    qs: list[torch.Tensor]
    ks: list[torch.Tensor]
    vs: list[torch.Tensor]
    full_k: list[torch.Tensor]
    full_v: list[torch.Tensor]
    cached_slots: list[int]

    @classmethod
    def build(cls, steps, *, seed: int, d: int, dtype=torch.float32, hq: int = 6, hkv: int = 2, bs: int = 4,
              nblocks: int = 40) -> PagedCase:
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(nblocks, generator=gen)
        c = cls(steps, d, nblocks, [], [0], [], [], [], [], [], [], [])
        used = 0
        for new, ctx in steps:
            nb = -(-ctx // bs)
            table = perm[used:used + nb]
            used += nb
            c.tables.append(table)
            k_all = torch.randn(ctx, hkv, d, generator=gen).to(dtype)
            v_all = torch.randn(ctx, hkv, d, generator=gen).to(dtype)
            pos = [int(table[p // bs]) * bs + p % bs for p in range(ctx)]
            c.cached_slots += pos[:ctx - new]
            c.slots += pos[ctx - new:]
            c.qs.append(torch.randn(new, hq, d, generator=gen).to(dtype))
            c.ks.append(k_all[ctx - new:])
            c.vs.append(v_all[ctx - new:])
            c.full_k.append(k_all)
            c.full_v.append(v_all)
            c.qsl.append(c.qsl[-1] + new)
        return c

    def fill(self, cache: torch.Tensor) -> None:
        """Write every sequence's cached part into `cache` through the step's own write path."""
        if self.cached_slots:
            cached = [len(k) - len(n) for k, n in zip(self.full_k, self.ks)]
            write_kv(torch.cat([k[:n] for k, n in zip(self.full_k, cached)]),
                     torch.cat([v[:n] for v, n in zip(self.full_v, cached)]), cache, torch.tensor(self.cached_slots))

    def metadata(self) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=torch.tensor(self.slots), query_start_loc=list(self.qsl),
                                 context_lens=[c for _, c in self.steps], block_tables=self.tables,
                                 is_decode_only=all(n == 1 for n, _ in self.steps))
        meta.check()
        return meta

    def attend(self, cache: torch.Tensor) -> torch.Tensor:
        return paged_attention(torch.cat(self.qs), torch.cat(self.ks), torch.cat(self.vs), cache, self.metadata(),
                               self.d ** -0.5)
