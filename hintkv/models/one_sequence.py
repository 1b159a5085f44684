"""`OneSequence`: one sequence's forward over a contiguous paged KV cache, without an engine.

The same `AttentionMetadata` the serving path builds, over block table 0..n-1. Used where a model
runs alone: W8A8 calibration (`calibration.py`), the accuracy benchmark and the exactness tests.
"""

from __future__ import annotations

import torch

from hintkv.models.attention import AttentionMetadata
from hintkv.models.kv_quant import cache_row

BLOCK = 16


class OneSequence:
    """One sequence's KV on a contiguous block table; `step(ids)` appends tokens, returns their logits."""

    def __init__(self, model, max_tokens: int, kv_cache_dtype: str = "auto") -> None:
        cfg = model.config
        self.model = model
        num_blocks = -(-max_tokens // BLOCK)
        row, storage = cache_row(cfg.head_dim, model.dtype, kv_cache_dtype)
        shape = (2, num_blocks, BLOCK, cfg.num_key_value_heads, row)
        self.kv_caches = [torch.zeros(shape, dtype=storage, device=model.device)
                          for _ in range(cfg.num_hidden_layers)]
        self.table = torch.arange(num_blocks, device=model.device)
        self.num_tokens = 0

    def hidden(self, ids: list[int]) -> torch.Tensor:
        """Final-normed hidden states [len(ids), hidden] of the new tokens, appended after the cached ones."""
        dev = self.model.device
        start, end = self.num_tokens, self.num_tokens + len(ids)
        pos = torch.arange(start, end, device=dev)
        meta = AttentionMetadata(slot_mapping=pos.clone(), query_start_loc=[0, len(ids)], context_lens=[end],
                                 block_tables=[self.table], is_decode_only=len(ids) == 1)
        out = self.model(torch.tensor(ids, device=dev), pos, meta, self.kv_caches)
        self.num_tokens = end
        return out

    def step(self, ids: list[int]) -> torch.Tensor:
        """Float32 logits [len(ids), vocab] of the new tokens, appended after the cached ones."""
        return self.model.compute_logits(self.hidden(ids))
