"""The one place attention happens: write new K/V into the paged cache, attend over block tables.

KV cache layout (one tensor per layer, allocated by the engine's model runner):

    kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim]     (0 = K, 1 = V)
    flat slot of (block b, offset o) = b * block_size + o

Rows of a step's `q/k/v` are the sequences' new tokens, concatenated:

    rows:   | seq 0 new tokens | seq 1 new tokens | ... |      query_start_loc = [0, q0, q0+q1, ...]
    seq i:  | cached (context_lens[i] - q_len) | new (q_len) |  positions 0 .. context_lens[i]-1

On a CPU with a float32 cache every step runs `cpu_kernels.attention` (C++, flash style, reading
the block tables itself). Otherwise three PyTorch paths, picked per step:
  * short queries, every sequence bringing at most SHORT_QUERY_MAX tokens on top of a cached
    context (decodes; speculative verifies of k drafts): one batched SDPA over padded contexts,
    the GQA group folded into the query rows, a causal mask per (sequence, token) row;
  * cold prefill (the whole context is new): SDPA on the fresh k/v with `is_causal=True`;
  * prefill on top of a cached prefix: gather the context through the block table, causal mask
    offset by the cached length (on CPU: prefix and new tokens as two fused SDPA calls merged by
    their log-sum-exp, no mask tensor).
An int8 / fp8 cache (`kv_quant.py`) is quantised on write and dequantised on read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from hintkv.models import cpu_kernels
from hintkv.models.kv_quant import is_quantised, quantise, read_kv

SHORT_QUERY_MAX = 33  # new tokens per sequence that still take the batched path (1 + 32 drafts)


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: flat slot where each new token's K/V is written
    query_start_loc: list[int]  # len B+1: rows of sequence i are query_start_loc[i]:query_start_loc[i+1]
    context_lens: list[int]  # len B: tokens of seq i after this step (cached + new)
    block_tables: list[torch.Tensor]  # len B: long block ids of seq i, in order (cover context_lens[i])
    is_decode_only: bool  # every sequence has q_len == 1 -> batched path
    # Tensors derived from the fields above, filled lazily by the first layer and reused by the others;
    # so build a fresh AttentionMetadata for every step.
    derived: dict[str, torch.Tensor] = field(default_factory=dict)
    # A CUDA-graph decode step (`cuda_graphs.py`): (block table [B, NB], context lengths [B]) as
    # tensors of fixed shape; attention then reads only tensors (`decode_static`), never the lists.
    static: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    def check(self) -> None:
        """Raise if the fields disagree with each other (cheap; tests call it)."""
        b = len(self.context_lens)
        if len(self.query_start_loc) != b + 1 or len(self.block_tables) != b:
            raise ValueError("query_start_loc must have B+1 entries and block_tables B")
        if self.query_start_loc[0] != 0 or self.query_start_loc[-1] != self.slot_mapping.numel():
            raise ValueError("query_start_loc must span exactly the slot_mapping rows")
        for i in range(b):
            q_len = self.query_start_loc[i + 1] - self.query_start_loc[i]
            if not 0 < q_len <= self.context_lens[i]:
                raise ValueError(f"seq {i}: q_len {q_len} must be in (0, context_len]")
            if self.is_decode_only and q_len != 1:
                raise ValueError("is_decode_only requires q_len == 1 for every sequence")


def suffix_rows(meta: AttentionMetadata, keep_last: list[int]) -> tuple[torch.Tensor, AttentionMetadata]:
    """The rows of the last `keep_last[i]` new tokens of each sequence i and the metadata of a step of those
    queries alone: sequence i keeps its context and block table, its q_len becomes keep_last[i] (a sequence
    keeping none leaves the step). A suffix is what attention's row layout can express: query j of the kept
    rows sits at position context_lens[i] - keep_last[i] + j, as it did in the whole step.

        seq i:  | cached | new, dropped | new, kept (keep_last[i]) |
    """
    qsl, rows, sub_qsl, ctx, tables, slots = meta.query_start_loc, [], [0], [], [], []
    for i, n in enumerate(keep_last):
        if not 0 <= n <= qsl[i + 1] - qsl[i]:
            raise ValueError(f"seq {i}: keep_last {n} must be in [0, q_len]")
        if n:
            rows.extend(range(qsl[i + 1] - n, qsl[i + 1]))
            sub_qsl.append(sub_qsl[-1] + n)
            ctx.append(meta.context_lens[i])
            tables.append(meta.block_tables[i])
    index = torch.tensor(rows, dtype=torch.long, device=meta.slot_mapping.device)
    sub = AttentionMetadata(slot_mapping=meta.slot_mapping.index_select(0, index), query_start_loc=sub_qsl,
                            context_lens=ctx, block_tables=tables, is_decode_only=all(n == 1 for n in keep_last if n))
    return index, sub


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter the step's new K/V rows into their slots (quantised first for an int8 / fp8 cache)."""
    _, num_blocks, block_size, hkv, d = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, hkv, d)
    if is_quantised(kv_cache):
        k, v = quantise(k, kv_cache.dtype), quantise(v, kv_cache.dtype)
    flat[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor, context_len: int,
                   dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence's first `context_len` tokens, each [context_len, Hkv, D] of `dtype`
    (default: the cache's, float32 for a quantised cache)."""
    if dtype is None:
        dtype = torch.float32 if is_quantised(kv_cache) else kv_cache.dtype
    _, _, block_size, hkv, d = kv_cache.shape
    num_blocks = -(-context_len // block_size)
    blocks = kv_cache.index_select(1, block_table[:num_blocks])  # [2, nb, bs, Hkv, D]
    kv = read_kv(blocks.reshape(2, num_blocks * block_size, hkv, d)[:, :context_len], dtype)
    return kv[0], kv[1]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention output [T, Hq, D] of the step's queries; also writes k/v into `kv_cache`.

    q: [T, Hq, D]; k, v: [T, Hkv, D]. Exact causal attention over each sequence's whole context.
    """
    fast = cpu_kernels.attention(q, k, v, kv_cache, meta, scale)  # C++ on a float32 CPU step (writes K/V too)
    if fast is not None:
        return fast
    write_kv(k, v, kv_cache, meta.slot_mapping)
    if meta.static is not None:
        return decode_static(q, kv_cache, *meta.static, scale)
    if _short_queries(meta):
        return _short_batch(q, kv_cache, meta, scale)
    out = torch.empty_like(q)
    qsl = meta.query_start_loc
    for i in range(meta.num_seqs):
        start, end = qsl[i], qsl[i + 1]
        ctx = meta.context_lens[i]
        if end - start == ctx:  # cold prefill: everything is in the fresh k/v already
            out[start:end] = _sdpa(q[start:end], k[start:end], v[start:end], scale, causal=True)
            continue
        kc, vc = gather_context(kv_cache, meta.block_tables[i], ctx, q.dtype)
        out[start:end] = _sdpa_after_prefix(q[start:end], kc, vc, scale)
    return out


def _sdpa_after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA of q [Lq, H, D], the last Lq tokens of a context k / v [S, Hkv, D]: query j sits at
    position S - Lq + j and sees keys 0 .. S - Lq + j (a causal mask aligned to the bottom right).

    On a CPU: two fused SDPA calls merged by their log-sum-exp, exact: the cached prefix (every key
    visible, no mask) and the new tokens (a square causal block). One SDPA with the lower-right mask
    materialises it and computes every masked score: 17.3 vs 7.1 ms for 128 queries over 2048 keys,
    8 heads, one thread (the step of a 2048-token prompt with 1920 cached spent 45% there); with
    GQA (8 / 2 heads) and the prefix's group folded into its query rows: 40-43 vs 18-21 ms at load 3."""
    lq, s = q.shape[0], k.shape[0]
    if q.device.type != "cpu":  # a bias object, not a boolean tensor: SDPA keeps its fused kernel
        return _sdpa(q, k, v, scale, mask=causal_lower_right(lq, s))
    hkv, d = k.shape[1], k.shape[2]
    group, p = q.shape[1] // hkv, s - lq
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    # the prefix: the GQA group folded into the query rows (no mask, so row order is free): each KV
    # head read once, never repeated
    qf = q.view(lq, hkv, group, d).permute(1, 0, 2, 3).reshape(1, hkv, lq * group, d)
    o_old, lse_old = flash(qf, k[:p].transpose(0, 1).unsqueeze(0), v[:p].transpose(0, 1).unsqueeze(0), 0.0, False,
                           scale=scale)[:2]
    o_old = o_old.view(hkv, lq, group, d).permute(0, 2, 1, 3).reshape(1, hkv * group, lq, d)
    lse_old = lse_old.view(hkv, lq, group).permute(0, 2, 1).reshape(1, hkv * group, lq)
    # the new tokens: causal over themselves (square), K/V heads repeated for these lq rows only
    kn, vn = (t[p:].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0) for t in (k, v))
    o_new, lse_new = flash(q.transpose(0, 1).unsqueeze(0), kn, vn, 0.0, True, scale=scale)[:2]
    lse = torch.logaddexp(lse_old, lse_new)
    o = (o_old.float() * (lse_old - lse).exp_().unsqueeze(-1)).add_(
        o_new.float() * (lse_new - lse).exp_().unsqueeze(-1))
    return o.to(q.dtype).squeeze(0).transpose(0, 1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *,
          causal: bool = False, mask: torch.Tensor | object | None = None) -> torch.Tensor:
    """SDPA of one sequence in [L, H, D] row layout. GQA by repeating K/V heads: on CPU that beats
    `enable_gqa=True` (242 vs 381 ms for a causal 2048 x 2048, 9 query / 3 KV heads)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, is_causal=causal, scale=scale)
    return o.squeeze(0).transpose(0, 1)


def _short_queries(meta: AttentionMetadata) -> bool:
    """Whether every sequence brings at most SHORT_QUERY_MAX new tokens on top of a cached context
    (decodes, speculative verifies): then one batched SDPA serves the whole step."""
    if meta.is_decode_only:
        return True
    qsl, ctx = meta.query_start_loc, meta.context_lens
    return all(qsl[i + 1] - qsl[i] <= SHORT_QUERY_MAX and qsl[i + 1] - qsl[i] < ctx[i]
               for i in range(len(ctx)))


def _short_batch(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """One SDPA for B sequences of Q <= SHORT_QUERY_MAX new tokens each, over padded contexts.

    GQA is folded into the query rows: the `group` query heads sharing a KV head become `group`
    rows, so a KV head is read once. Rows of the padded query, per (sequence, KV head):

        | token 0: group heads | token 1: group heads | ... | token Q-1 |     (Q * group rows)

    query token j of sequence i sits at position ctx_i - q_i + j and sees keys 0 .. that position
    (a boolean mask [B, 1, Q * group, L]); pad tokens (j >= q_i) see the whole context and are dropped.
    """
    _, hq, d = q.shape
    _, _, block_size, hkv, _ = kv_cache.shape
    group = hq // hkv
    b = meta.num_seqs
    derived = meta.derived
    if "short_table" not in derived:
        _derive_short(meta, block_size, group, q.device)
    table, rows = derived["short_table"], derived.get("short_rows")
    q_max = int(derived["short_q_max"])
    ctx_max = max(meta.context_lens)
    # index_select, not kv_cache[:, table]: advanced indexing is ~5x slower on CPU here
    kv = kv_cache.index_select(1, table.view(-1))  # [2, B*nb, bs, Hkv, D']
    kv = read_kv(kv.view(2, b, -1, hkv, kv.shape[-1])[:, :, :ctx_max], q.dtype).transpose(2, 3)  # [2, B, Hkv, L, D]
    if rows is None:  # one token per sequence: no padding
        qg = q.view(b, hkv, group, d)
    else:
        qp = q.new_zeros(b * q_max, hq, d)
        qp.index_copy_(0, rows, q)
        qg = qp.view(b, q_max, hkv, group, d).transpose(1, 2).reshape(b, hkv, q_max * group, d)
    o = F.scaled_dot_product_attention(qg, kv[0], kv[1], attn_mask=derived.get("short_mask"), scale=scale)
    if rows is None:
        return o.reshape(b, hq, d)
    o = o.view(b, hkv, q_max, group, d).transpose(1, 2).reshape(b * q_max, hq, d)
    return o.index_select(0, rows)


def decode_static(q: torch.Tensor, kv_cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """One decode token per sequence over a fixed-shape padded context: every shape comes from the
    tensors' shapes (B rows, NB blocks), never from their values, so a CUDA graph can capture it.

    q [B, Hq, D]; table [B, NB] block ids (pad entries: any valid block); lens [B] context lengths
    (<= NB * block_size; keys at or past a sequence's length are masked out)."""
    b, hq, d = q.shape
    hkv = kv_cache.shape[3]
    group = hq // hkv
    kv = kv_cache.index_select(1, table.reshape(-1))  # [2, B*NB, bs, Hkv, D']
    kv = read_kv(kv.view(2, b, -1, hkv, kv.shape[-1]), q.dtype).transpose(2, 3)  # [2, B, Hkv, L, D]
    positions = torch.arange(kv.shape[3], device=q.device)
    mask = (positions[None, :] < lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
    o = F.scaled_dot_product_attention(q.view(b, hkv, group, d), kv[0], kv[1], attn_mask=mask, scale=scale)
    return o.reshape(b, hq, d)


def _derive_short(meta: AttentionMetadata, block_size: int, group: int, device: torch.device) -> None:
    """The padded block table, the query rows' places and the mask of `_short_batch` (per step,
    shared by every layer)."""
    b, ctx, qsl = meta.num_seqs, meta.context_lens, meta.query_start_loc
    q_lens = [qsl[i + 1] - qsl[i] for i in range(b)]
    q_max, ctx_max = max(q_lens), max(ctx)
    num_blocks = -(-ctx_max // block_size)
    table = torch.zeros(b, num_blocks, dtype=torch.long, device=device)
    for i, bt in enumerate(meta.block_tables):
        n = min(num_blocks, bt.numel())
        table[i, :n] = bt[:n]
    meta.derived["short_table"] = table
    meta.derived["short_q_max"] = torch.tensor(q_max)
    if q_max == 1:
        if b > 1 and min(ctx) != ctx_max:
            lens = torch.tensor(ctx, device=device)
            valid = torch.arange(ctx_max, device=device)[None, :] < lens[:, None]
            meta.derived["short_mask"] = valid[:, None, None, :]  # [B, 1, 1, L]
        return
    meta.derived["short_rows"] = torch.tensor(
        [i * q_max + j for i in range(b) for j in range(q_lens[i])], dtype=torch.long, device=device)
    lens = torch.tensor(ctx, device=device)[:, None]
    first = lens - torch.tensor(q_lens, device=device)[:, None]  # position of each sequence's token 0
    limit = torch.minimum(first + torch.arange(q_max, device=device)[None, :] + 1, lens)  # [B, Q]
    valid = torch.arange(ctx_max, device=device)[None, None, :] < limit[:, :, None]  # [B, Q, L]
    meta.derived["short_mask"] = (valid[:, None, :, None, :].expand(b, 1, q_max, group, ctx_max)
                                  .reshape(b, 1, q_max * group, ctx_max))
