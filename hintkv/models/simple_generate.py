"""A minimal paged KV cache and greedy loop, for tests, smoke checks and model-only benchmarks.

This is NOT the serving path (that is `hintkv/engine/model_runner.py`): no prefix sharing, no
eviction, blocks handed out from a free list in order. It exists so the model can be run and
checked on its own, e.g. `python -m hintkv.models.bench_speed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hintkv.models.attention import AttentionMetadata
from hintkv.models.config import ModelConfig
from hintkv.models.llama import LlamaForCausalLM


@dataclass(slots=True)
class _SeqState:
    num_tokens: int = 0  # tokens whose K/V are in the cache
    blocks: list[int] = field(default_factory=list)


class SimpleKVCache:
    """Per-layer caches `[2, num_blocks, block_size, Hkv, D]` plus a block list per sequence."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.block_size = block_size
        self.device = torch.device(device)
        shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.free_blocks = list(range(num_blocks))
        self.seqs: dict[str, _SeqState] = {}

    def num_tokens(self, seq_id: str) -> int:
        return self.seqs[seq_id].num_tokens if seq_id in self.seqs else 0

    def build_step(self, batch: list[tuple[str, list[int]]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, meta) appending each sequence's new tokens after its cached ones."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl, ctx_lens, tables = [0], [], []
        for seq_id, new in batch:
            st = self.seqs.setdefault(seq_id, _SeqState())
            start, end = st.num_tokens, st.num_tokens + len(new)
            while len(st.blocks) * self.block_size < end:
                if not self.free_blocks:
                    raise RuntimeError("SimpleKVCache is out of blocks")
                st.blocks.append(self.free_blocks.pop(0))
            ids.extend(new)
            positions.extend(range(start, end))
            slots.extend(st.blocks[p // self.block_size] * self.block_size + p % self.block_size
                         for p in range(start, end))
            st.num_tokens = end
            qsl.append(len(ids))
            ctx_lens.append(end)
            tables.append(torch.tensor(st.blocks, dtype=torch.long, device=self.device))
        as_long = dict(dtype=torch.long, device=self.device)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, **as_long), query_start_loc=qsl, context_lens=ctx_lens,
            block_tables=tables, is_decode_only=all(len(new) == 1 for _, new in batch))
        return torch.tensor(ids, **as_long), torch.tensor(positions, **as_long), meta

    def free(self, seq_id: str) -> None:
        self.free_blocks.extend(self.seqs.pop(seq_id).blocks)


def run_step(model: LlamaForCausalLM, cache: SimpleKVCache, batch: list[tuple[str, list[int]]]) -> torch.Tensor:
    """Forward the batch and return float32 logits of each sequence's last new token [B, vocab]."""
    input_ids, positions, meta = cache.build_step(batch)
    hidden = model(input_ids, positions, meta, cache.kv_caches)
    last_rows = torch.tensor(meta.query_start_loc[1:], device=hidden.device) - 1
    return model.compute_logits(hidden[last_rows])


def greedy_generate(model: LlamaForCausalLM, cache: SimpleKVCache, prompt_ids: list[int], max_new_tokens: int,
                    eos_token_ids: list[int] | tuple[int, ...] = (), seq_id: str = "gen",
                    prefill_chunk: int | None = None) -> list[int]:
    """Greedy continuation of one prompt (prefilled in chunks of `prefill_chunk` tokens if set)."""
    chunk = prefill_chunk or len(prompt_ids)
    for i in range(0, len(prompt_ids), chunk):
        logits = run_step(model, cache, [(seq_id, prompt_ids[i:i + chunk])])
    out: list[int] = []
    for _ in range(max_new_tokens):
        tok = int(logits[0].argmax())
        out.append(tok)
        if tok in eos_token_ids:
            break
        logits = run_step(model, cache, [(seq_id, [tok])])
    return out
